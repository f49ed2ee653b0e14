#!/usr/bin/env bash
# GPU check of dspark_core/kernels on one CUDA device, in well under 5 minutes:
#   1. every kernel test, compiled for the device (not interpreted): kernel == torch twin, the engine with
#      kernels on == off, plus the micro-benchmarks once each as smoke tests;
#   2. the micro-benchmarks for real (kernel vs twin, achieved bytes/s vs the device's peak), written as
#      pytest-benchmark JSON for `harness ingest`.
# Usage: bash scripts/gpu_kernels.sh [JSON_PATH]   (default: ${OUT:-results}/gpu_kernels.json)
# Needs torch with CUDA and triton (CUDA builds of torch bring it); installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JSON=${1:-${OUT:-results}/gpu_kernels.json}
mkdir -p "$(dirname "$JSON")"
unset TRITON_INTERPRET DSPARK_KERNELS
export TRITON_DEFAULT_FP_FUSION=${TRITON_DEFAULT_FP_FUSION:-1}

"$PY" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_kernels.sh: no CUDA device visible to torch")
try:
    import triton
except ImportError:
    sys.exit("gpu_kernels.sh: triton is not installed (pip install 'dspark-harness[kernels]')")
p = torch.cuda.get_device_properties(0)
print(f"device: {p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}; "
      f"torch {torch.__version__}, triton {triton.__version__}")
PY

start=$(date +%s)
echo "== 1/2 kernel tests (compiled) =="
# a failing test is reported and the micro-benchmarks still run (the lent minutes are few); exit 1 at the end
tests_rc=0
"$PY" -m pytest tests/dspark_core/kernel_tests -q -ra -p no:cacheprovider --benchmark-disable || tests_rc=$?
echo "== 2/2 micro-benchmarks -> $JSON =="
"$PY" -m pytest tests/dspark_core/kernel_tests/test_bench_kernels.py -q -p no:cacheprovider \
  --benchmark-enable --benchmark-json="$JSON" --benchmark-group-by=func,param:num_rows \
  --benchmark-columns=min,median,mean,stddev,rounds --benchmark-sort=fullname
"$PY" - "$JSON" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print(f"{'benchmark':<58} {'mean ms':>9} {'GB/s':>8} {'of peak':>8}")
for b in doc["benchmarks"]:
    x = b.get("extra_info", {})
    frac = x.get("fraction_of_peak")
    print(f"{b['name']:<58} {b['stats']['mean'] * 1e3:9.3f} {x.get('achieved_GBps', ''):>8} "
          f"{'' if frac is None else f'{frac:.0%}':>8}")
PY
echo "done in $(( $(date +%s) - start )) s; ingest with: harness ingest $JSON"
if [ "$tests_rc" -ne 0 ]; then
  echo "gpu_kernels.sh: kernel tests failed (pytest exit $tests_rc): the timings above are of kernels that are not equal to their twins" >&2
  exit 1
fi
