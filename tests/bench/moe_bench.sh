#!/usr/bin/env bash
# Mixture-of-experts speed beside llama.cpp, on one GGUF both read: a
# Mixtral-shaped model scaled to a small machine (tests/bench/moe_gguf.py:
# 16 layers, dim 1024, 8 experts of 3,584, 2 a token, random Q4_0, 0.88 GB).
# For 1 and 16 streams of 128-token prompts -> 64 tokens each:
#   decode tok/s   ours: streams / median step time (llmserve-engine-bench);
#                  llama.cpp: llama-batched-bench's S_TG (-fa on)
#   whole run s    prefill and decode of every stream
# Medians of REPS runs, the two engines interleaved. A benchmark, not a test.
#   LLAMA_BIN=/path/to/llama.cpp/build/bin tests/bench/moe_bench.sh [REPS]    THREADS (default 2)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BUILD_DIR:-$ROOT/build}
REPS=${1:-3}
T=${THREADS:-2}
LB=${LLAMA_BIN:-}
SRC=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
PY=${PYTHON:-$BIN/.venv-ref/bin/python}
[ -x "$PY" ] || PY=python3
GG=${MOE_GGUF:-$BIN/moe-bench.gguf}
# MOE_ARGS: moe_gguf.py's shape flags (--gpt-oss: gpt-oss with MXFP4 experts), for a MOE_GGUF of their own
[ -f "$GG" ] || "$PY" "$ROOT/tests/bench/moe_gguf.py" "$SRC" "$GG" ${MOE_ARGS:-}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
declare -A R
for rep in $(seq 1 "$REPS"); do
    out=$("$BIN/llmserve-engine-bench" --model "$GG" --concurrency 1,16 --prompt-len 128 --gen 64 --repeats 1 \
          --threads "$T" 2>&1)
    [ "$rep" = 1 ] && echo "$out" | head -1
    for c in 1 16; do
        row=$(echo "$out" | awk -v c="$c" '$1 == c && NF >= 5')
        R[ours_dec_$c]+="$(echo "$row" | awk -v c="$c" '{printf "%.2f", c * 1000 / $5}') "
        R[ours_wall_$c]+="$(echo "$row" | awk '{print $4}') "
    done
    if [ -n "$LB" ]; then
        lo=$("$LB/llama-batched-bench" -m "$GG" -c 4096 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,16 -fa on -t "$T" 2>/dev/null)
        for c in 1 16; do
            row=$(echo "$lo" | awk -F'|' -v c="$c" '$2+0 == 128 && $4+0 == c')
            R[ll_dec_$c]+="$(echo "$row" | awk -F'|' '{print $9+0}') "
            R[ll_wall_$c]+="$(echo "$row" | awk -F'|' '{print $10+0}') "
        done
    fi
done
printf '\n%-28s %12s %12s %8s\n' "median of $REPS ($T threads)" llmserve llama.cpp ratio
for c in 1 16; do
    for k in dec wall; do
        o=$(echo ${R[ours_${k}_$c]} | tr ' ' '\n' | median)
        l=$([ -n "$LB" ] && echo ${R[ll_${k}_$c]} | tr ' ' '\n' | median || echo "")
        r=$([ -n "$l" ] && awk -v o="$o" -v l="$l" -v k="$k" 'BEGIN {printf "%.2fx", k == "dec" ? o / l : l / o}' || echo "-")
        printf '%-28s %12s %12s %8s\n' "$([ $k = dec ] && echo "decode tok/s" || echo "whole run s"), $c streams" "$o" "${l:--}" "$r"
    done
done
