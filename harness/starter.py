"""`harness init [PATH]`: a commented starter suite that runs as it is on the embedded default.

Why a file rather than a flag of `run`: a first suite is something to edit. Every key in it is explained
where it stands and docs/SUITES.md has the rest; it runs in about a minute on two CPU cores, and it has
plain decoding next to its drafters so the ×plain column is filled from the first run.
"""

from __future__ import annotations

import sys
from pathlib import Path

STARTER = """\
# A starter suite (written by `harness init`). Every key is in docs/SUITES.md; run it with
#   harness run suite.yaml                     # about a minute on 2 CPU cores
#   harness run suite.yaml --dry-run           # the cells it would run
version: 1                  # the suite format
name: starter               # runs are grouped by name (history, estimates)
description: Plain decoding vs DSpark on the embedded default, GSM8K, two loads.

defaults:
  backend: inhouse          # inhouse | vllm | sglang | openai (any OpenAI-compatible endpoint)
  seed: 0                   # a cell parameter: another seed is another cell
  warmup: 1                 # conversations run before the measured ones, not measured
  repeats: 1                # runs of every cell (Mann-Whitney gates compare repeats)

targets:                    # the model that answers; `embedded` is the committed tiny Qwen3
  embedded: {path: embedded, dtype: float32}

drafters:                   # `none` (plain decoding) needs no entry
  dspark: {method: dspark, checkpoint: "embedded:dspark"}
  ngram: {method: ngram}    # no weights: drafts from the prompt's own n-grams

tasks:                      # gsm8k | humaneval | mt_bench; n_samples and max_new_tokens are required
  gsm8k: {n_samples: 8, max_new_tokens: 48, temperature: 0}

matrix:                     # the cells are the product of these axes
  drafter: [none, dspark, ngram]   # keep `none`: speculative cells are compared with it (×plain)
  num_drafts: [3]           # γ, drafts per step (plain decoding ignores it)
  task: [gsm8k]
  concurrency: [1, 4]       # closed-loop users; or `rate: [...]` requests/s (open loop)
  policy: [full]            # full | static | threshold | scheduler | budget | adaptive

sla: {ttft_s: 2.0, tpot_s: 0.2}   # per-request targets: goodput, attainment, and lines on the report's latency plots

gates:                      # `harness gate` judges these metrics against a baseline
  acceptance_length: {direction: higher, test: paired_bootstrap, relative: 0.02}
"""


def write_starter(path: str | Path, force: bool = False, out=None) -> int:
    """Write STARTER to `path`; exit 2 (one line) if it exists and `force` is not set."""
    out = out if out is not None else sys.stdout
    path = Path(path)
    if path.exists() and not force:
        print(f"harness: error: {path} exists; choose another path or pass --force", file=sys.stderr)
        return 2
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STARTER, encoding="utf-8")
    print(f"wrote {path}; next: harness run {path}  (reference: docs/SUITES.md)", file=out)
    return 0
