#!/usr/bin/env bash
# The GPU lane: one prepared run on a CUDA machine that has its own PyTorch, Triton and
# transformers but reaches no package registry. Writes its logs and JSON under $OUT.
#   1. the tests marked gpu (kernels, models, masks, positions, quantisation on CUDA);
#   2. benchmarks/attention.py --gpu-only: Triton FlashAttention-2 forward and backward against
#      torch SDPA, fp16/bf16, d 64/128, causal or not, n 1k-16k, every shape against float64;
#   3. benchmarks/train_gpu.py: GPT-2 small's shape, bf16, tokens/s and MFU, eager and compiled;
#   4. scripts/scaling_sweep.py (the modern decoder's isoFLOP sweep), in the background, beside
#   5. notebooks at LECTURE_BUDGET=large under nbval, four at a time, until the deadline.
#   "background-tests" runs step 1 beside step 5 instead of first (no timing is taken there).
# Usage: OUT=/some/dir DEADLINE_S=420 [LANE_STEPS="tests attention train sweep notebooks"] \
#          [TRAIN_RUNS="small/compiled/16 ..."] [ATTENTION_ARGS="--dtypes bf16 --head-dims 128"] \
#          [NOTEBOOKS_AT_ONCE=4] bash scripts/gpu_lane.sh [notebook ...]
# Python packages the machine lacks (nbval, a Jupyter kernel, altair, ...) travel as wheels in
# .whl/ and are installed where missing; lecture_pkg is imported from this checkout.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to a folder for the results}
start=$(date +%s)
deadline=$((start + ${DEADLINE_S:-420}))
left() { echo $((deadline - $(date +%s))); }
steps=" ${LANE_STEPS:-tests attention train sweep notebooks} "
wanted() { [[ "$steps" == *" $1 "* ]]; }
log="$OUT/lane.log"
say() { echo "== [$(($(date +%s) - start)) s] $*" | tee -a "$log"; }

export PYTHONUNBUFFERED=1
# Wheels only for what the machine lacks: a carried copy of a package it already has could
# shadow a build that matches its torch or numpy.
if [ -d .whl ]; then
  missing=$(python3 - .whl/*.whl <<'PY'
import importlib.metadata, re, sys
for wheel in sys.argv[1:]:
    name = re.sub(r"[-_.]+", "-", wheel.split("/")[-1].split("-")[0]).lower()
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        print(wheel)
PY
)
  # shellcheck disable=SC2086  # a list of paths without spaces
  [ -n "$missing" ] && { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site $missing >>"$log" 2>&1 || say "wheel install failed"; }
  echo "carried wheels installed: $(echo $missing | wc -w)" >>"$log"
fi
# lecture_pkg from this checkout, without installing: notebook kernels inherit the path.
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u;
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"; } 2>&1 | tee -a "$log"

gpu_tests() {
  timeout "$1" python3 -m pytest -p no:cacheprovider -q -m gpu \
    --continue-on-collection-errors tests/test_attention_triton.py tests/test_bert.py \
    tests/test_kernel_regression.py tests/test_masks.py tests/test_positional.py tests/test_quant.py \
    tests/test_t5.py 2>&1 | tail -40
}
wanted tests && say "1. tests marked gpu" && gpu_tests $(( $(left) < 240 ? $(left) : 240 )) | tee -a "$log"

# shellcheck disable=SC2086  # ATTENTION_ARGS is a list of words
wanted attention && say "2. attention benchmark" && timeout $(( $(left) < 240 ? $(left) : 240 )) python3 benchmarks/attention.py --gpu-only \
  --json "$OUT/attention.json" ${ATTENTION_ARGS:-} 2>&1 | tee -a "$log"

# shellcheck disable=SC2086  # TRAIN_RUNS is a list of words
wanted train && say "3. training throughput" && timeout $(( $(left) < 180 ? $(left) : 180 )) python3 benchmarks/train_gpu.py \
  --json "$OUT/train.json" ${TRAIN_RUNS:+--runs $TRAIN_RUNS} 2>&1 | tee -a "$log"

if wanted sweep; then
  say "4. scaling sweep, in the background ($(left) s left)"
  timeout $(( $(left) - 5 )) python3 scripts/scaling_sweep.py --out "$OUT/sweep.json" \
    --max-seconds $(( $(left) - 60 )) >"$OUT/sweep.log" 2>&1 &
  sweep=$!
fi

if wanted background-tests; then
  say "1. tests marked gpu, in the background ($(left) s left)"
  gpu_tests $(( $(left) - 10 )) >"$OUT/gpu_tests.log" 2>&1 &
  tests=$!
fi

if wanted notebooks && [ "$#" -gt 0 ] && [ "$(left)" -gt 30 ]; then
  at_once=${NOTEBOOKS_AT_ONCE:-4}
  say "5. notebooks at the large budget, $at_once at a time ($(left) s left)"
  mkdir -p /tmp/notebooks
  export LECTURE_BUDGET=large MPLBACKEND=Agg OUT deadline
  # One nbval process per notebook, so that each gets its own verdict and time even when the
  # deadline stops the others: "<notebook> rc=<status> <seconds> s" in notebooks.txt. SIGINT
  # at the deadline lets pytest print the failures it has seen before it stops.
  printf '%s\n' "$@" | xargs -P "$at_once" -I{} bash -c 'nb={}; name=$(basename "$nb" .ipynb); t0=$(date +%s)
    limit=$(( deadline - t0 - 35 )); [ "$limit" -gt 10 ] || exit 0
    timeout -s INT -k 20 "$limit" python3 -m pytest -p no:cacheprovider -q --nbval-lax --nbval-current-env \
      --nbval-cell-timeout=300 "$nb" >"/tmp/notebooks/$name.log" 2>&1
    echo "$name rc=$? $(( $(date +%s) - t0 )) s $(tail -1 /tmp/notebooks/$name.log)" >>"$OUT/notebooks.txt"'
  cat "$OUT/notebooks.txt" | tee -a "$log"
  tar -czf "$OUT/notebooks.tar.gz" -C /tmp notebooks
fi
[ -n "${sweep:-}" ] && wait "$sweep" && say "sweep finished" && tail -20 "$OUT/sweep.log" | tee -a "$log"
[ -n "${tests:-}" ] && wait "$tests"; [ -n "${tests:-}" ] && say "gpu tests" && tail -40 "$OUT/gpu_tests.log" | tee -a "$log"
say "done"
