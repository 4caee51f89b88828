#!/usr/bin/env bash
# CPU speed of the default model: prefill and decode tokens/s at 1 and 2
# threads (median of REPS runs), next to the memory-bandwidth bound
# (model bytes / measured read bandwidth, for a 1 GiB buffer streamed from
# DRAM and for a buffer of the model's size, which a large L3 may hold).
# A benchmark, not a test.
#
#   tests/bench/cpu_bench.sh [MODEL] [REPS]
# With LLAMA_BENCH=/path/to/llama-bench set, runs llama.cpp's llama-bench on
# the same file, threads and lengths, interleaved with ours, for a ratio.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BUILD_DIR:-$ROOT/build}
MODEL=${1:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
REPS=${2:-5}
PP=${PP:-512}
TG=${TG:-128}
[ -x "$BIN/llmserve" ] || { echo "build first (tools/setup.sh build)"; exit 1; }

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# a prompt of exactly PP tokens is not needed: PP words give roughly PP tokens;
# the tool reports the real count it processed.
prompt=$(python3 -c "import random; random.seed(1); w='the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you were her she there been one all we their'.split(); print(' '.join(random.choice(w) for _ in range($PP)))")

bytes=$(stat -c %s "$MODEL")
printf 'model %s (%.1f MB)\n' "$(basename "$MODEL")" "$(echo "$bytes/1000000" | bc -l)"
mib=$(( bytes / 1048576 + 1 ))
printf '%-8s %-10s %12s %12s %12s %10s\n' threads engine prefill_tok/s decode_tok/s bound_tok/s of_bound
for t in 1 2; do
    bw=$("$BIN/llmserve-membw" "$t" 1024 | awk '{print $2}')
    bwc=$("$BIN/llmserve-membw" "$t" "$mib" | awk '{print $2}')
    bound=$(echo "$bw*1000000000/$bytes" | bc -l)
    boundc=$(echo "$bwc*1000000000/$bytes" | bc -l)
    pre=(); dec=(); lpre=(); ldec=()
    for r in $(seq "$REPS"); do
        line=$("$BIN/llmserve" generate --model "$MODEL" --prompt "$prompt" -n "$TG" --ignore-eos \
               --temperature 0 --threads "$t" 2>&1 >/dev/null | grep 'prefill .* decode')
        pre+=("$(echo "$line" | sed -E 's/.*prefill [0-9]+ tokens at ([0-9.]+).*/\1/')")
        dec+=("$(echo "$line" | sed -E 's/.*decode [0-9]+ tokens at ([0-9.]+).*/\1/')")
        if [ -n "${LLAMA_BENCH:-}" ]; then
            out=$("$LLAMA_BENCH" -m "$MODEL" -p "$PP" -n "$TG" -t "$t" -r 1 -o csv 2>/dev/null)
            read -r a b < <(echo "$out" | python3 -c "
import csv, sys
rows = list(csv.DictReader(sys.stdin))
pp = [r['avg_ts'] for r in rows if r['n_prompt'] == '$PP' and r['n_gen'] == '0']
tg = [r['avg_ts'] for r in rows if r['n_prompt'] == '0' and r['n_gen'] == '$TG']
print(pp[0], tg[0])")
            lpre+=("$a"); ldec+=("$b")
        fi
    done
    mp=$(printf '%s\n' "${pre[@]}" | median); md=$(printf '%s\n' "${dec[@]}" | median)
    printf '%-8s %-10s %12.1f %12.1f %12.1f %9.0f%%\n' "$t" llmserve "$mp" "$md" "$bound" "$(echo "100*$md/$bound" | bc -l)"
    if [ -n "${LLAMA_BENCH:-}" ]; then
        lp=$(printf '%s\n' "${lpre[@]}" | median); ld=$(printf '%s\n' "${ldec[@]}" | median)
        printf '%-8s %-10s %12.1f %12.1f %12.1f %9.0f%%   (decode ratio llmserve/llama.cpp %.2f)\n' \
            "$t" llama.cpp "$lp" "$ld" "$bound" "$(echo "100*$ld/$bound" | bc -l)" "$(echo "$md/$ld" | bc -l)"
    fi
    printf '         (read bandwidth with %s thread(s): %s GB/s from a 1 GiB buffer -> bound %.0f tok/s;\n' "$t" "$bw" "$bound"
    printf '          %s GB/s from a %s MiB buffer -> bound %.0f tok/s; llmserve decode = %.0f%% of that)\n' \
        "$bwc" "$mib" "$boundc" "$(echo "100*$md/$boundc" | bc -l)"
done
