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
    assert out.count("lean ÷ HF") == 2 and "differ" not in out


def test_median_interval_is_order_statistics():
    med, lo, hi = target_forward.median_interval([float(x) for x in range(1, 21)])
    assert med == 10.5 and (lo, hi) == (6.0, 15.0)  # n = 20: the 6th and 15th order statistics at 95%
