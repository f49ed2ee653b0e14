"""A synthetic-acceptance cell end to end on the in-house engine: its per-position acceptance follows the
suite's law (statistically), and every row it touches says it is synthetic — cell params and label,
provenance, a flag metric in the store — while the audit refuses it; a real cell keeps its id."""

from __future__ import annotations

import json
import math
from pathlib import Path

from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec
from harness.cli import main
from harness.store import read_only_query

LAW = (0.9, 0.5, 0.2)

SUITE = """\
version: 1
name: synth
targets:
  embedded: {path: embedded}
drafters:
  ngram: {method: ngram}
  fixed: {method: ngram, synthetic_acceptance: [0.9, 0.5, 0.2]}
tasks:
  gsm8k: {n_samples: 8, max_new_tokens: 40, temperature: 0}
defaults: {backend: inhouse, warmup: 0, repeats: 1}
backend_options:
  inhouse: {num_threads: 1}
matrix:
  target: [embedded]
  drafter: [fixed, ngram]
  num_drafts: [4]
  task: [gsm8k]
  concurrency: [4]
"""


def test_synthetic_cell_follows_its_law_and_is_marked_everywhere(tmp_path, data_env, capsys):
    suite, db = tmp_path / "synth.yaml", tmp_path / "h.duckdb"
    suite.write_text(SUITE)
    assert main(["run", str(suite), "--db", str(db)]) == 0
    assert "SYNTHETIC α=0.9,0.5,0.2" in capsys.readouterr().out  # the run summary names it
    _, cells = read_only_query(db, "select drafter, label, params, provenance from cells order by drafter")
    (fixed, ngram) = cells
    assert "SYNTHETIC" in fixed[1] and "SYNTHETIC" not in ngram[1]
    assert json.loads(fixed[2])["drafter"]["synthetic_acceptance"] == list(LAW)
    assert "synthetic_acceptance" not in json.loads(ngram[2])["drafter"]
    assert json.loads(fixed[3])["synthetic_acceptance"] == list(LAW)
    _, flags = read_only_query(db, "select c.drafter, m.value from metrics m join cells c using (run_id, cell_id, "
                                   "repeat) where m.metric = 'synthetic_acceptance'")
    assert flags == [("fixed", 1.0)]
    # measured per-position conditional acceptance against the law: accepted_k / reached_k from the steps
    _, steps = read_only_query(db, "select s.num_verified, s.num_accepted from request_steps s join cells c "
                                   "using (run_id, cell_id, repeat) where c.drafter = 'fixed'")
    for k in range(1, 5):
        reached = [(v, a) for v, a in steps if v >= k and a >= k - 1]
        rate = LAW[min(k, len(LAW)) - 1]
        if len(reached) < 20:
            continue
        observed = sum(a >= k for _, a in reached) / len(reached)
        assert abs(observed - rate) < 4 * math.sqrt(rate * (1 - rate) / len(reached)) + 1e-9, (k, observed)

    from harness.audit import run_audit
    from io import StringIO
    out = StringIO()
    run_audit(suite, only=["drafter=fixed"], out=out)
    assert "REFUSED" in out.getvalue() and "not lossless" in out.getvalue()


def test_real_cells_keep_their_ids():
    """The new drafter field is absent from a real cell's params, so the CI baseline's cell ids still match."""
    table = json.loads((Path(__file__).resolve().parents[2] / "results" / "baselines" / "ci.json").read_text())
    cells = table["tables"]["cells"]
    for row in cells["rows"]:
        stored = dict(zip(cells["columns"], row))
        p = stored["params"]
        cell = Cell(p["backend"], TargetSpec(**p["target"]), DrafterSpec(**p["drafter"]), p["num_drafts"],
                    TaskSpec(**p["task"]), PolicySpec(**p["policy"]), concurrency=p["concurrency"], rate=p["rate"],
                    warmup=p["warmup"], seed=p["seed"], backend_options=tuple(sorted(p["backend_options"].items())))
        assert cell.cell_id == stored["cell_id"] and not cell.is_synthetic
    synthetic = Cell(cell.backend, cell.target, DrafterSpec("dspark", "dspark", "embedded:dspark", None, (0.8,)), 3,
                     cell.task, cell.policy, concurrency=1)
    assert synthetic.cell_id != cell.cell_id and synthetic.is_synthetic
    assert synthetic.params()["drafter"]["synthetic_acceptance"] == [0.8] and "SYNTHETIC α=0.8" in synthetic.label()
