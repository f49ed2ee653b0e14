"""One SLA type from the suite to the store: a real in-house cell under `sla:` runs ok and stores goodput and
SLA attainment, judged by the bounds the suite wrote (a bound nobody can meet gives attainment 0)."""

from __future__ import annotations

import dataclasses

import pytest

from harness.cli import main
from harness.metrics import SLA
from harness.store import read_only_query
from harness.suite import schema

SUITE = """\
version: 1
name: sla
targets:
  embedded: {path: embedded}
drafters:
  dspark: {method: dspark, checkpoint: "embedded:dspark"}
tasks:
  gsm8k: {n_samples: 4, max_new_tokens: 12, temperature: 0}
defaults: {backend: inhouse, warmup: 0, repeats: 1}
backend_options:
  inhouse: {num_threads: 1}
matrix:
  target: [embedded]
  drafter: [dspark]
  num_drafts: [3]
  task: [gsm8k]
  concurrency: [2]
sla: %(sla)s
"""


def test_the_suite_section_has_the_fields_of_the_one_sla_type():
    assert list(schema.SLA.model_fields) == [f.name for f in dataclasses.fields(SLA)]


@pytest.mark.parametrize("sla, attained", [("{ttft_s: 600.0, tpot_s: 60.0}", 1.0),
                                           ("{ttft_s: 600.0, min_user_tokens_per_s: 1000000000.0}", 0.0)])
def test_a_real_cell_under_an_sla_stores_goodput_and_attainment(tmp_path, data_env, capsys, sla, attained):
    suite, db = tmp_path / "sla.yaml", tmp_path / "h.duckdb"
    suite.write_text(SUITE % {"sla": sla})
    assert main(["run", str(suite), "--db", str(db)]) == 0
    assert "1 ok, 0 failed" in capsys.readouterr().out
    _, rows = read_only_query(db, "select metric, value, n from metrics where metric in "
                                  "('goodput', 'sla_attainment', 'throughput') order by metric")
    values = {metric: (value, n) for metric, value, n in rows}
    assert values["sla_attainment"] == (attained, 4)  # all 4 measured requests judged
    goodput, throughput = values["goodput"][0], values["throughput"][0]
    assert throughput > 0 and goodput == pytest.approx(throughput * attained)
