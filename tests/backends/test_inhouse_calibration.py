"""A draft's level offsets reach the in-house engine's cell: stored beside its STS temperatures, applied to the
calibrated ECE (and to the policies, through the same `Built.offsets`), and a draft without them is STS alone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.runner import run_suite
from harness.store import Store

REPO = Path(__file__).resolve().parents[2]
DRAFT = REPO / "models" / "embedded" / "drafts" / "dspark"

SUITE = """\
version: 1
name: offsets
targets:
  embedded: {{path: embedded}}
drafters:
  plain_sts: {{method: dspark, checkpoint: '{sts}'}}
  levelled: {{method: dspark, checkpoint: '{levelled}'}}
tasks:
  gsm8k: {{n_samples: 3, max_new_tokens: 16, temperature: 0}}
defaults: {{backend: inhouse, warmup: 0, repeats: 1, policy: thr}}
policies:
  thr: {{name: threshold, threshold: 0.3}}
backend_options:
  inhouse: {{num_threads: 1, max_context: 512}}
matrix:
  target: [embedded]
  drafter: [plain_sts, levelled]
  num_drafts: [3]
  task: [gsm8k]
  concurrency: [1]
validity: {{min_requests: 1, min_duration_s: 0.0, max_failed_fraction: 0.0}}
"""


@pytest.mark.skipif(not (DRAFT / "draft_config.json").exists(), reason="no embedded default DSpark draft")
def test_level_offsets_are_stored_and_calibrate_the_cell(tmp_path, data_env):
    sts, levelled = tmp_path / "sts", tmp_path / "levelled"
    shutil.copytree(DRAFT, sts)
    shutil.copytree(DRAFT, levelled)
    config = json.loads((levelled / "draft_config.json").read_text())
    offsets = {t: [-1.5] * len(v) for t, v in config["extra"]["sts_temperatures"].items()}
    config["extra"]["sts_offsets"] = offsets
    (levelled / "draft_config.json").write_text(json.dumps(config))
    suite = tmp_path / "suite.yaml"
    suite.write_text(SUITE.format(sts=sts, levelled=levelled))
    outcome = run_suite(suite, db_path=tmp_path / "db.duckdb")
    assert [o.status for o in outcome.outcomes] == ["ok", "ok"]
    with Store.open(tmp_path / "db.duckdb", read_only=True) as store:
        _, rows = store.query("SELECT drafter, sts_temperatures, sts_offsets FROM cells ORDER BY drafter")
        (_, lev_temps, lev_offsets), (_, sts_temps, sts_offsets) = rows
        assert json.loads(lev_temps) == json.loads(sts_temps) == config["extra"]["sts_temperatures"]["0"][:3]
        assert json.loads(lev_offsets) == offsets["0"][:3] and sts_offsets is None
        _, metrics = store.query("SELECT c.drafter, m.metric, m.value FROM metrics m JOIN cells c USING (run_id, cell_id)"
                                 " WHERE m.metric IN ('ece_raw', 'ece_calibrated', 'verified_per_step') ORDER BY 1, 2")
    by = {(d, m): v for d, m, v in metrics}
    # A −1.5 offset lowers every calibrated confidence: the threshold policy verifies fewer drafts per step, and
    # the calibrated ECE is of those lowered confidences (the raw one is the head's own, whatever the offsets).
    assert by[("levelled", "verified_per_step")] < by[("plain_sts", "verified_per_step")]
    assert by[("levelled", "ece_calibrated")] != by[("plain_sts", "ece_calibrated")]
