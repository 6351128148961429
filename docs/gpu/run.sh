#!/usr/bin/env bash
# One lease on a lent GPU, as one script: Glance's bench on CUDA in float32 eager (the lossless check: every output
# must equal plain greedy decoding's), bfloat16 eager and compiled on the suite, off the suite, and the batch sweep.
# Each part has its own time limit and lands in $OUT/results.tgz as soon as it ends (a lease can end any time).
# DEVICE (default cuda) and EXTRA (arguments appended to every bench, e.g. "--limit 1 --max-new-tokens 4") let it be
# tried on a CPU first.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
DEVICE=${DEVICE:-cuda}
EXTRA=${EXTRA:-}
RUNS=/tmp/glance-gpu
mkdir -p "$RUNS" "$OUT"
if ls .whl/*.whl > /dev/null 2>&1; then  # the image's transformers is older than pyproject.toml's range
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2> /dev/null
  python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
  nproc
} | tee "$RUNS/machine.txt"

part() {  # part NAME SECONDS BENCH-ARGS...: one bench run under its own limit, its log and results packed at once
  local name=$1 limit=$2
  shift 2
  echo "== $(date +%T) $name (at most $limit s)"
  # shellcheck disable=SC2086  # EXTRA is a list of arguments
  timeout "$limit" python3 main.py bench --device "$DEVICE" --out "$RUNS/$name" "$@" $EXTRA > "$RUNS/$name.log" 2>&1
  echo "exit $?" >> "$RUNS/$name.log"
  tail -n 25 "$RUNS/$name.log"
  tar czf "$OUT/results.tgz" -C "$RUNS" .
}

GLANCE_METHODS=ar,vanilla,medusa,eagle,eagle3,dflash,mtp,lookahead,prompt_lookup
# Limits from the first lease (docs/gpu/README.md): the float32 part took about 50 s; 24 prompts with transformers'
# assisted rows ran about 1.2 runs/s and needed some 230 s, so the later parts take 8 prompts and transformers'
# generate alone; compiling took about 100 s. From the second: float32 35 s, compiled 169 s, the sweep 153 s alone
# (its batch-1 runs were slowed by cuDNN's plans, engine/runtime/attention_backend.py); together under one call's 600 s.
part f32-eager 75 --dtype float32 --compile off --methods "$GLANCE_METHODS,hf_dflash" --limit 8 --max-new-tokens 48
part bf16-eager 90 --compile off --methods "$GLANCE_METHODS,hf_generate" --limit 8 --max-new-tokens 64
part bf16-compiled 190 --compile on --methods "$GLANCE_METHODS,hf_generate" --limit 8 --max-new-tokens 64
part offsuite-eager 80 --compile off --methods "$GLANCE_METHODS" --prompts resources/prompts/offsuite.jsonl \
  --max-new-tokens 128 --repeats 1
part sweep-eager 160 --compile off --methods "$GLANCE_METHODS" --batch-sizes 1,4,16,64 --limit 4 --max-new-tokens 32
echo "== $(date +%T) done"
