"""The prepared GPU check (scripts/gpu_check.sh) dry-run on the CPU at toy shapes: it finishes, its JSON is
what `harness ingest` loads, and the engine part holds the whole SPS(B) grid and the Markov head's share."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _toy_shapes():
    """benchmarks/gpu_engine.py's TOY (tests/benchmarks, a package of the same name, shadows `benchmarks`)."""
    spec = importlib.util.spec_from_file_location("gpu_engine", REPO / "benchmarks" / "gpu_engine.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_engine"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.TOY


@pytest.mark.slow
def test_the_gpu_check_dry_runs_at_toy_shapes_and_its_json_ingests(tmp_path):
    out = tmp_path / "gpu_check"
    env = {**os.environ, "GPU_CHECK_TOY": "1", "PYTHONPATH": str(REPO)}
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    toy = _toy_shapes()
    engine = json.loads((out / "engine.json").read_text())["benchmarks"]
    sps = {(b["params"]["requests"], b["params"]["verified_per_request"]) for b in engine if b["group"] == "sps"}
    assert sps == {(r, v) for r in toy.requests for v in toy.verified}
    shares = [b for b in engine if b["group"] == "markov-share"]
    assert [b["params"]["requests"] for b in shares] == list(toy.requests)
    for b in shares:
        x = b["extra_info"]
        assert x["share_low"] <= x["share_median"] <= x["share_high"] and b["stats"]["rounds"] >= 4
    assert json.loads((out / "sps.json").read_text())  # the v = 8 table the scheduler policies read
    from harness.cli import main

    db = tmp_path / "h.duckdb"
    for name in ("kernels.json", "engine.json"):
        assert main(["ingest", str(out / name), "--db", str(db)]) == 0
    from harness.store import read_only_query

    _, rows = read_only_query(db, "select count(*) from benchmarks")
    assert rows[0][0] == len(engine)  # no kernel micro-benchmarks without CUDA
    if os.environ.get("HARNESS_DATA_DIR") or (REPO.parent / "shared" / "datasets").is_dir():
        tables = (out / "random.txt").read_text()  # step 3: the engine end to end on a random-weight target
        assert "RANDOM-WEIGHTS" in tables and "SYNTHETIC" in tables and "throughput" in tables
