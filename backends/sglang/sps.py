"""SPS tables written by SGLang's `python -m sglang.benchmark.dspark_sps_profiler`, in our format.

SGLang writes one of two JSON shapes (`sglang/srt/speculative/dspark_components/dspark_sps.py`):

- `SpsCostTable` {"sample_batch_tokens": [B_i…], "sample_steps_per_sec": [s_i…], "max_batch_tokens": M}:
  steps/s against the tokens verified in one step (requests × verify width), looked up with the *floor*
  rule — SPS(B) = s_i for the largest B_i ≤ B (s_0 below B_0), up to M.
- `SpsAdditiveCostTable` {"bias_seconds", "bs_probes", "alpha_seconds", "m_probes", "theta_seconds"}:
  step time = bias + α(requests) + θ(requests + budget), each piecewise linear, clamped at the ends.

Ours (`dspark_core/costs/table_files.py`, JSON "dspark-sps-tables" version 1) keys B the same way (tokens verified per
step) but looks up with the *ceiling* rule, so the floor table becomes, exactly on 1 … M: a point
(B_{i+1} − 1, s_i) closing each of SGLang's intervals, and (M, s_last) — plus (B_0 − 1, s_0) below the
first probe. The additive table has two variables; at a fixed verify width W = γ + 1 (every request
verifying all γ drafts: requests = B / W, budget = requests × γ) it is a curve in B, sampled at every
multiple of W up to `max_batch_tokens` (required for it). This module reads files only (no torch, no
dspark_core), so the harness can convert without the engine:

    python -m backends.sglang.sps dspark_sps.json out.json --device-name "NVIDIA H100 80GB HBM3" \\
        --dtype bfloat16 --target-id Qwen/Qwen3-8B --context-len 512 [--gamma 7 --max-batch-tokens 2048]
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping

OUR_FORMAT = "dspark-sps-tables"


def read_sglang_sps(path: str | Path, *, gamma: int | None = None, max_batch_tokens: int | None = None
                    ) -> tuple[list[int], list[float], dict[str, Any]]:
    """(batch sizes, steps/s, meta) in our ceiling-lookup convention from an SGLang SPS JSON file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a JSON object")
    if "sample_batch_tokens" in data:
        sizes, sps = _from_floor_table(data, path)
        meta = {"source": str(path), "sglang_table": "SpsCostTable", "lookup_converted": "floor to ceiling"}
    elif "bias_seconds" in data:
        if gamma is None:
            raise ValueError(f"{path}: an SGLang additive table (SpsAdditiveCostTable) needs --gamma: the curve "
                             "SPS(B) is taken at a verify width of γ + 1 per request")
        sizes, sps = _from_additive_table(data, path, gamma, max_batch_tokens)
        meta = {"source": str(path), "sglang_table": "SpsAdditiveCostTable", "gamma": gamma}
    else:
        raise ValueError(f"{path}: not an SGLang SPS table (expected sample_batch_tokens/sample_steps_per_sec or "
                         "bias_seconds/bs_probes/alpha_seconds/m_probes/theta_seconds)")
    return sizes, sps, meta


def _from_floor_table(data: Mapping[str, Any], path: Path) -> tuple[list[int], list[float]]:
    probes = [int(b) for b in data.get("sample_batch_tokens") or []]
    values = [float(s) for s in data.get("sample_steps_per_sec") or []]
    if not probes or len(probes) != len(values):
        raise ValueError(f"{path}: sample_batch_tokens and sample_steps_per_sec must be non-empty and equally long")
    if probes != sorted(set(probes)) or probes[0] < 1:
        raise ValueError(f"{path}: sample_batch_tokens must be strictly increasing integers >= 1, got {probes}")
    if any(not math.isfinite(s) or s <= 0 for s in values):
        raise ValueError(f"{path}: sample_steps_per_sec must be finite and > 0")
    top = int(data.get("max_batch_tokens") or probes[-1])
    if top < probes[-1]:
        raise ValueError(f"{path}: max_batch_tokens {top} is below the largest probe {probes[-1]}")
    points: list[tuple[int, float]] = []
    if probes[0] > 1:
        points.append((probes[0] - 1, values[0]))  # SGLang clamps below its first probe
    points += [(probes[i + 1] - 1, values[i]) for i in range(len(probes) - 1)]
    points.append((top, values[-1]))
    merged: dict[int, float] = {}
    for b, s in points:  # adjacent probes (B_{i+1} − 1 = B_i) collapse onto one point
        merged.setdefault(b, s)
    sizes = sorted(merged)
    return sizes, [merged[b] for b in sizes]


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    hi = bisect.bisect_right(xs, x)
    t = (x - xs[hi - 1]) / (xs[hi] - xs[hi - 1])
    return ys[hi - 1] + t * (ys[hi] - ys[hi - 1])


def _from_additive_table(data: Mapping[str, Any], path: Path, gamma: int, max_batch_tokens: int | None
                         ) -> tuple[list[int], list[float]]:
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    try:
        bias = float(data["bias_seconds"])
        bs, alpha = [float(x) for x in data["bs_probes"]], [float(x) for x in data["alpha_seconds"]]
        ms, theta = [float(x) for x in data["m_probes"]], [float(x) for x in data["theta_seconds"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: malformed additive table ({exc})") from None
    if not bs or not ms or len(bs) != len(alpha) or len(ms) != len(theta) or bias <= 0:
        raise ValueError(f"{path}: additive table needs bias_seconds > 0 and non-empty, equally long probe lists")
    width = gamma + 1
    top = int(max_batch_tokens or (max(ms) // width) * width)
    if top < width:
        raise ValueError(f"{path}: max batch tokens {top} is below one request's verify width {width}")
    sizes, sps = [], []
    for b in range(width, top + 1, width):
        requests = b // width
        seconds = bias + _interp(bs, alpha, requests) + _interp(ms, theta, requests + requests * gamma)
        if seconds <= 0:
            raise ValueError(f"{path}: step time {seconds} s at B={b} is not positive")
        sizes.append(b)
        sps.append(1.0 / seconds)
    return sizes, sps


def to_our_table(sizes: list[int], sps: list[float], fingerprint: Mapping[str, Any], meta: Mapping[str, Any]) -> dict:
    """One table entry of our SPS JSON store."""
    fp = {k: fingerprint[k] for k in ("device_name", "dtype", "target_id", "context_len")}
    return {"fingerprint": fp, "batch_sizes": list(sizes), "steps_per_second": list(sps), "meta": dict(meta)}


def import_sps_table(sglang_path: str | Path, out_path: str | Path, fingerprint: Mapping[str, Any], *,
                     gamma: int | None = None, max_batch_tokens: int | None = None) -> dict:
    """Convert `sglang_path` and add it to our SPS store `out_path` (created if absent), replacing a table
    with the same fingerprint. A store that already holds step-cost tables (format version 2) keeps them."""
    sizes, sps, meta = read_sglang_sps(sglang_path, gamma=gamma, max_batch_tokens=max_batch_tokens)
    table = to_our_table(sizes, sps, fingerprint, meta)
    out_path = Path(out_path)
    doc: dict[str, Any] = {"format": OUR_FORMAT, "version": 1, "tables": []}
    if out_path.exists():
        doc = json.loads(out_path.read_text())
        if doc.get("format") != OUR_FORMAT:
            raise ValueError(f"{out_path}: not an SPS store (\"format\": \"{OUR_FORMAT}\")")
    doc["tables"] = [t for t in doc.get("tables", []) if t.get("fingerprint") != table["fingerprint"]] + [table]
    tmp = out_path.with_name(out_path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out_path)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m backends.sglang.sps", description=__doc__.split("\n\n")[0])
    parser.add_argument("sglang_table", help="JSON written by sglang.benchmark.dspark_sps_profiler")
    parser.add_argument("out", help="our SPS store (dspark_core/costs format); created or updated")
    parser.add_argument("--device-name", required=True, help="e.g. 'NVIDIA H100 80GB HBM3' (as torch names it)")
    parser.add_argument("--dtype", required=True, help="target dtype, e.g. bfloat16")
    parser.add_argument("--target-id", required=True, help="target model id or path")
    parser.add_argument("--context-len", type=int, required=True, help="context length the profile ran at")
    parser.add_argument("--gamma", type=int, help="additive tables: γ (verify width γ + 1 per request)")
    parser.add_argument("--max-batch-tokens", type=int, help="additive tables: largest B to tabulate")
    args = parser.parse_args(argv)
    fp = {"device_name": args.device_name, "dtype": args.dtype, "target_id": args.target_id, "context_len": args.context_len}
    try:
        table = import_sps_table(args.sglang_table, args.out, fp, gamma=args.gamma, max_batch_tokens=args.max_batch_tokens)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {len(table['batch_sizes'])} points, B {table['batch_sizes'][0]} … {table['batch_sizes'][-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
