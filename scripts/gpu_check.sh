#!/usr/bin/env bash
# The one prepared GPU check, for the day a GPU machine is lent (torch, triton and transformers there; no
# network, no vLLM). Finishes in <= 8 min on an H200 and writes pytest-benchmark JSON for `harness ingest`:
#   1. kernels.json  the Triton kernels compiled for the device against their torch twins (every kernel test),
#                    then their micro-benchmarks (scripts/gpu_kernels.sh; at most 5 min);
#   2. engine.json   the in-house engine at Qwen3-8B shapes with random weights (built from a config, nothing
#                    downloaded): step time vs batch size and verified tokens (SPS(B) for this GPU, also saved
#                    as sps.json for the scheduler/budget policies) and the Markov head's share of a step
#                    (benchmarks/gpu_engine.py; at most 3 min);
#   3. random.duckdb the in-house engine end to end at Qwen3-8B shapes, random weights, a Qwen3-0.6B-shaped
#                    draft accepted by a fixed law (synthetic acceptance, never lossless): suites/gpu-random.yaml,
#                    throughput and speedup at that law, c 1 and 8 (at most 3 min; random.txt: the tables).
#                    Needs GSM8K: $HARNESS_DATA_DIR, else ../shared/datasets or shared/datasets beside the repo.
# Usage: bash scripts/gpu_check.sh [DIR]            (default: ${OUT:-results}/gpu_check)
#        GPU_CHECK_TOY=1 bash scripts/gpu_check.sh DIR   the same on the CPU at toy shapes: a dry run of the
#                    script (the kernels' micro-benchmarks need CUDA: kernels.json then lists none)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DIR=${1:-${OUT:-results}/gpu_check}
mkdir -p "$DIR"
start=$(date +%s)
failed=()
if [ "${GPU_CHECK_TOY:-0}" = 1 ]; then
  echo "== toy dry run on the CPU =="
  # the kernels' micro-benchmarks need CUDA (their correctness tests run interpreted in the CPU pytest run)
  echo '{"benchmarks": [], "machine_info": {"note": "toy dry run: kernel micro-benchmarks need CUDA"}}' > "$DIR/kernels.json"
  "$PY" -m benchmarks.gpu_engine --toy --out "$DIR/engine.json" --sps-table "$DIR/sps.json"
  RANDOM_TARGET=tiny RANDOM_ARGS=(--only concurrency=1 --n-samples 2 --max-new-tokens 8)
else
  # The steps are independent: a failing one is reported and the next still runs (a lent GPU's minutes are
  # few, and one failure must not cost the other measurements); the script fails at the end.
  echo "== 1/3 kernels: tests compiled for the device, then micro-benchmarks =="
  timeout 270 bash scripts/gpu_kernels.sh "$DIR/kernels.json" || failed+=("kernels (exit $?)")
  echo "== 2/3 engine at Qwen3-8B shapes, random weights =="
  timeout 150 "$PY" -m benchmarks.gpu_engine --out "$DIR/engine.json" --sps-table "$DIR/sps.json" \
    || failed+=("engine (exit $?)")
  RANDOM_TARGET=qwen3-8b RANDOM_ARGS=()
fi
for data in "${HARNESS_DATA_DIR:-}" ../shared/datasets shared/datasets; do
  if [ -n "$data" ] && [ -d "$data" ]; then export HARNESS_DATA_DIR=$(cd "$data" && pwd); break; fi
done
if [ -n "${HARNESS_DATA_DIR:-}" ]; then
  echo "== 3/3 synthetic acceptance at production shapes (target $RANDOM_TARGET, random weights) =="
  rm -f "$DIR/random.duckdb"
  # exit 1 is a failed cell: recorded in the store and printed below, the check goes on
  rc=0
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 timeout 150 "$PY" -m harness run suites/gpu-random.yaml \
    --only "target=$RANDOM_TARGET" ${RANDOM_ARGS[@]+"${RANDOM_ARGS[@]}"} --db "$DIR/random.duckdb" --no-progress || rc=$?
  [ "$rc" -le 1 ] || failed+=("random suite (exit $rc)")
  if [ -f "$DIR/random.duckdb" ]; then
    "$PY" -m harness query --db "$DIR/random.duckdb" "select label, status, metric, round(value, 3) as value, unit \
      from v_metrics where metric in ('throughput', 'acceptance_length', 'tpot_p50') order by label, metric" > "$DIR/random.txt"
    "$PY" -m harness query --db "$DIR/random.duckdb" "select label, round(speedup, 3) as speedup, \
      round(sandwich_drift, 3) as in_round_drift, status from v_speedup_summary order by label" >> "$DIR/random.txt"
    cat "$DIR/random.txt"
  fi
else
  echo "== 3/3 skipped: no GSM8K data (set HARNESS_DATA_DIR) =="
fi
"$PY" - "$DIR/kernels.json" "$DIR/engine.json" <<'PY' || failed+=("benchmark JSON")
import json, sys
for path in sys.argv[1:]:
    doc = json.load(open(path))
    assert isinstance(doc.get("benchmarks"), list), f"{path}: not pytest-benchmark JSON"
    print(f"{path}: {len(doc['benchmarks'])} benchmarks")
PY
echo "done in $(( $(date +%s) - start )) s; ingest with: harness ingest $DIR/kernels.json; harness ingest $DIR/engine.json"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
