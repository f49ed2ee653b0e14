"""benchmarks/target_forward.py runs end to end on a small random Llama and prints its paired ratio."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# tests/benchmarks shadows the top-level benchmarks package on sys.path: load the script by its path.
_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "target_forward.py"
_spec = importlib.util.spec_from_file_location("benchmarks_target_forward", _PATH)
target_forward = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(target_forward)


def test_paired_lean_vs_hf_runs(capsys):
    assert target_forward.main(["--model", "tiny", "--batch", "1", "3", "--context", "6", "--rounds", "4",
                                "--steps", "1", "--clock", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.count("lean ÷ hf") == 2 and "differ" not in out


def test_packed_vs_unpacked_runs_decode_and_verify_shaped_steps(capsys):
    assert target_forward.main(["--model", "tiny", "--against", "unpacked", "--batch", "2", "--tokens", "1", "8",
                                "--context", "6", "--rounds", "4", "--steps", "1", "--clock", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.count("lean ÷ unpacked") == 2 and "× 8 token(s)" in out


def test_median_ratio_is_the_speedup_median_with_its_order_statistics():
    med, lo, hi = target_forward.median_ratio([float(x) for x in range(1, 21)])
    assert abs(med - 110 ** 0.5) < 1e-9 and (lo, hi) == (6.0, 15.0)  # geometric median; 6th, 15th at 95%
    assert target_forward.median_ratio([0.9, 1.1, 1.0])[1:] == (0.9, 1.1)  # no 95% interval below 6: min–max


def test_engine_ratio_pairs_rounds_per_concurrency():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "engine_ratio.py"
    spec = importlib.util.spec_from_file_location("benchmarks_engine_ratio", path)
    engine_ratio = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine_ratio)
    rows = [("inhouse", "none", "full", 1, 0, 20.0), ("vllm", "none", "full", 1, 0, 25.0),
            ("inhouse", "dspark", "adaptive", 1, 0, 50.0), ("inhouse", "dspark", "full", 1, 0, 60.0),
            ("inhouse", "none", "adaptive", 1, 1, 30.0), ("vllm", "none", "adaptive", 1, 1, 30.0),
            ("inhouse", "dspark", "adaptive", 1, 1, None), ("inhouse", "dspark", "full", 1, 1, 45.0),
            ("inhouse", "none", "full", 16, 0, 90.0), ("vllm", "none", "full", 16, 1, 100.0)]  # c 16: no round with both
    # every in-house cell over vLLM's plain cell of its own round (whatever policy label plain carries):
    # plain and each DSpark policy against the same baseline, one figure per policy
    assert engine_ratio.round_ratios(rows) == {
        ("none", "full", 1): [0.8], ("none", "adaptive", 1): [1.0],
        ("dspark", "adaptive", 1): [2.0], ("dspark", "full", 1): [2.4, 1.5]}
