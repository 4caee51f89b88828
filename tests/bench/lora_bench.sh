#!/usr/bin/env bash
# Multi-LoRA's cost: 16 streams (128-token prompts -> 64 tokens) of the
# default model alone, and the same 16 streams spread over 8 adapters (rank
# 16 on all seven projections of every layer) in the same batches. Medians
# of REPS runs, interleaved: decode step time (llmserve-engine-bench's
# median step) and generated tok/s. A benchmark, not a test.
#   tests/bench/lora_bench.sh [MODEL] [REPS]     THREADS (default 2)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BUILD_DIR:-$ROOT/build}
MODEL=${1:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
REPS=${2:-3}
T=${THREADS:-2}
PY=${PYTHON:-$BIN/.venv-ref/bin/python}
[ -x "$PY" ] || PY=python3
DIR=$BIN/lora-bench
[ -d "$DIR/lora-7" ] || "$PY" "$ROOT/tests/bench/lora_adapters.py" "$MODEL" "$DIR" 8 16
MODS=()
for i in $(seq 0 7); do MODS+=(--lora-modules "l$i=$DIR/lora-$i"); done
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
bench() { "$BIN/llmserve-engine-bench" --model "$MODEL" --concurrency 16 --prompt-len 128 --gen 64 --repeats 1 \
          --threads "$T" "$@" 2>&1; }
B_STEP=() L_STEP=() B_TOK=() L_TOK=()
for _ in $(seq 1 "$REPS"); do
    b=$(bench); l=$(bench --enable-lora --max-loras 8 "${MODS[@]}")
    B_STEP+=("$(echo "$b" | awk '$1 == 16 {print $5}')"); B_TOK+=("$(echo "$b" | awk '$1 == 16 {print $2}')")
    L_STEP+=("$(echo "$l" | awk '$1 == 16 {print $5}')"); L_TOK+=("$(echo "$l" | awk '$1 == 16 {print $2}')")
done
echo "$b" | head -1
bs=$(printf '%s\n' "${B_STEP[@]}" | median); ls=$(printf '%s\n' "${L_STEP[@]}" | median)
bt=$(printf '%s\n' "${B_TOK[@]}" | median); lt=$(printf '%s\n' "${L_TOK[@]}" | median)
printf '\n%-34s %14s %12s\n' "median of $REPS, 16 streams" "step ms (med)" "tok/s"
printf '%-34s %14s %12s\n' "base model" "$bs" "$bt"
printf '%-34s %14s %12s\n' "8 adapters, rank 16, in one batch" "$ls" "$lt"
awk -v b="$bs" -v l="$ls" 'BEGIN {printf "adapters / base step time: %.2fx\n", l / b}'
