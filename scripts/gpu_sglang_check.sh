#!/usr/bin/env bash
# GPU check of the SGLang backend against the in-house engine, on the embedded default, in a few minutes:
#   1. exports the embedded DSpark and DFlash drafts to the DeepSpec/vLLM layout (backends.vllm.export);
#   2. runs GSM8K (8 prompts, 48 tokens, greedy, γ 3, concurrency 1) through SGLangBackend — a real
#      `python -m sglang.launch_server` per drafter, requests over the native /generate, acceptance from
#      each response's meta_info — and through InhouseBackend;
#   3. prints τ per drafter for both engines and the acceptance source, and fails (exit 1) when a greedy
#      output differs from in-house plain decoding or a cell fails.
# A τ difference is printed, not failed: SGLang's DFLASH is a fill-in drafter (mask slots predict their own
# positions) while our drafts are anchor-sampling (see backends/vllm/export.py), and SGLang's DSPARK
# build must support our export (markov_head_type vanilla, confidence_head_with_markov) — record it.
#
# Usage: bash scripts/gpu_sglang_check.sh
#   SGLANG_PYTHON   interpreter with sglang installed (default: python3); installs nothing
#   SGLANG_OPTIONS  JSON of extra backend_options.sglang (default: {"attention_backend": "triton",
#                   "mem_fraction_static": 0.5}); the embedded target's head_dim is 32
#   DRAFTERS        space-separated subset of "none ngram dflash dspark" (default: all)
#   HARNESS_DATA_DIR  task data (default: ../shared/datasets when present)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export SGLANG_PYTHON=${SGLANG_PYTHON:-python3}
export DRAFTERS=${DRAFTERS:-"none ngram dflash dspark"}
if [[ -z "${HARNESS_DATA_DIR:-}" && -d ../shared/datasets ]]; then export HARNESS_DATA_DIR=../shared/datasets; fi

"$SGLANG_PYTHON" - <<'PY'
import sys
try:
    import sglang, torch
except ImportError as exc:
    sys.exit(f"gpu_sglang_check.sh: {exc}; install sglang (GPU only) or set SGLANG_PYTHON")
if not torch.cuda.is_available():
    sys.exit("gpu_sglang_check.sh: no CUDA device visible to torch")
print(f"sglang {sglang.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
PY

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
for d in dspark dflash; do
  "$PY" -m backends.vllm.export "models/embedded/drafts/$d" "$WORK/$d" --target models/embedded/target
done

WORK="$WORK" "$PY" - <<'PY'
import json, os, sys, time
from contracts.cells import Cell, DrafterSpec, PolicySpec, TargetSpec, TaskSpec
from backends.inhouse.adapter import InhouseBackend
from backends.sglang.adapter import SGLangBackend

work = os.environ["WORK"]
options = {"python": os.environ["SGLANG_PYTHON"], "port": 30123, "startup_timeout_s": 900,
           **json.loads(os.environ.get("SGLANG_OPTIONS") or '{"attention_backend": "triton", "mem_fraction_static": 0.5}')}
drafters = {"none": (DrafterSpec("none", "none"), DrafterSpec("none", "none"), 0),
            "ngram": (DrafterSpec("ngram", "ngram"), DrafterSpec("ngram", "ngram"), 3),
            "dflash": (DrafterSpec("dflash", "dflash", f"{work}/dflash"), DrafterSpec("dflash", "dflash", "embedded:dflash"), 3),
            "dspark": (DrafterSpec("dspark", "dspark", f"{work}/dspark"), DrafterSpec("dspark", "dspark", "embedded:dspark"), 3)}
task = TaskSpec("gsm8k", 8, 48)

def cell(backend, drafter, gamma):
    return Cell(backend, TargetSpec("embedded", "embedded", "float32"), drafter, gamma, task, PolicySpec("full"), concurrency=1)

def outputs(result):
    return {r.sample_index: list(r.output_ids) for r in result.requests}

inhouse, sglang = InhouseBackend(), SGLangBackend(**options)
failed, plain, rows = False, None, []
try:
    for name in os.environ["DRAFTERS"].split():
        for_sglang, for_inhouse, gamma = drafters[name]
        mine = inhouse.run_cell(cell("inhouse", for_inhouse, gamma))
        plain = plain or (outputs(mine) if name == "none" else None)
        t = time.time()
        try:
            theirs = sglang.run_cell(cell("sglang", for_sglang, gamma))
        except Exception as exc:  # noqa: BLE001 — report and go on with the next drafter
            print(f"[{name}] SGLang cell failed:\n{exc}")
            failed = True
            continue
        same = plain is None or outputs(theirs) == plain
        errors = sum(r.record.failed for r in theirs.requests)
        failed |= (not same) or errors > 0
        rows.append((name, mine.metrics.value("acceptance_length"), theirs.metrics.value("acceptance_length"),
                     theirs.provenance.get("acceptance_source"), same, errors, time.time() - t))
finally:
    sglang.close()
    inhouse.close()
print(f"{'drafter':<8} {'τ in-house':>10} {'τ sglang':>9} {'source':>12} {'greedy = plain':>15} {'failed':>6} {'s':>6}")
for name, a, b, source, same, errors, secs in rows:
    fmt = lambda v: "-" if v is None else f"{v:.3f}"
    print(f"{name:<8} {fmt(a):>10} {fmt(b):>9} {source or '-':>12} {str(same):>15} {errors:>6} {secs:>6.0f}")
sys.exit(1 if failed else 0)
PY
