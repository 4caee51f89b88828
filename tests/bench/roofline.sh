#!/usr/bin/env bash
# The decode roofline at real model sizes on the machine it runs on: each figure beside the bound it is under.
#   read bound     llmserve-membw: streaming reads with THREADS threads over a buffer 4x the last-level cache
#                  (at least 4 GiB), the best of 5: the most weight bytes a second decode can read from DRAM
#   kernel bound   llmserve-gemm-bench, one thread, a 64x1024 matrix (L1/L2-resident), batch 1, times THREADS:
#                  the most weight bytes a second each quantized dot kernel can consume, per type and path
#   GEMV           the same kernels at the 8B FFN shapes with their weights streamed from DRAM (--cold)
#   decode         llmserve-engine-bench on dummy weights of each shape and type (--load-format dummy), one
#                  sequence: the median step, and the file bytes a token reads (every matrix but the embedding
#                  table) over that step in GB/s
# GB/s are of the file's bytes (what llama.cpp reads of the same GGUF); the percentage is of the lower bound.
# Shapes: llama-3-8b, and llama-3-70b-4l (four layers of Llama-3-70B's shape with its embedding and head).
# With LLAMA_BIN (llama.cpp's build/bin), then llama-bench against us on one Llama-3-8B-shaped Q4_0 GGUF.
# A benchmark, not a test.
#
#   tests/bench/roofline.sh        THREADS (default 2), TYPES (default "q4_0 q4_k q6_k q8_0"),
#                                  SHAPES (default "llama-3-8b llama-3-70b-4l"), ISAS (default: every path present),
#                                  DECODE_ISAS (default: ISAS's paths; "" for the engine's own pick),
#                                  LLAMA_BIN, GGUF8B (the file, made once), REPS (default 3), LLAMA_ONLY=1
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BUILD_DIR:-$ROOT/build}
T=${THREADS:-2}
TYPES=${TYPES:-q4_0 q4_k q6_k q8_0}
SHAPES=${SHAPES:-llama-3-8b llama-3-70b-4l}
for b in llmserve-membw llmserve-gemm-bench llmserve-engine-bench; do
    [ -x "$BIN/$b" ] || { echo "build first (tools/setup.sh build): no $BIN/$b"; exit 1; }
done
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

if [ -n "${ISAS:-}" ]; then isas=$ISAS
elif [ "$(uname -m)" = aarch64 ]; then isas="neon-dotprod neon"
else isas="avx512 avx2"; fi
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
have=""
for f in avx2 avx512f avx512_vnni amx_int8 asimddp; do [[ " $flags " == *" $f "* ]] && have="$have $f"; done
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'); flags:$have; $T thread(s)"

# the shapes, as config.json files the dummy loader takes
cat > "$OUT/llama-3-8b.json" <<'EOF'
{"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
 "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0}
EOF
cat > "$OUT/llama-3-70b-4l.json" <<'EOF'
{"num_hidden_layers": 4, "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
 "intermediate_size": 28672, "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0}
EOF
tokbytes() { # SHAPE TYPE -> file bytes a decode token reads (every matrix but the embedding table)
    python3 - "$OUT/$1.json" "$2" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
D, L, H, V = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
hd = D // c["num_attention_heads"]
kv = c["num_key_value_heads"] * hd
per = {"q4_0": 18 / 32, "q4_1": 20 / 32, "q8_0": 34 / 32, "q4_k": 144 / 256, "q6_k": 210 / 256, "f16": 2, "bf16": 2}
print(int((L * (2 * D * D + 2 * D * kv + 3 * D * H) + V * D) * per[sys.argv[2]]))
EOF
}

if [ "${LLAMA_ONLY:-0}" != 1 ]; then # LLAMA_ONLY=1: section 5 alone
# 1. the read bound
llc=$(lscpu -B 2>/dev/null | awk '/^L3 cache:/ {print $3; exit}')
llc_mib=$(( ${llc:-33554432} / 1048576 ))
# 4x the L3, and no less than 4 GiB (8B's weights a token): a server L3's replacement keeps part of a cyclic
# working set only a few times its size, which flatters a read of 1-2 GiB
buf=$(( 4 * llc_mib > 4096 ? 4 * llc_mib : 4096 ))
avail=$(awk '/MemAvailable/ {print int($2 / 1024 / 3)}' /proc/meminfo)
[ "$buf" -gt "$avail" ] && buf=$avail
# the best of 5 (a bound is what the machine can do; a shared machine's samples swing 25-29 GB/s)
bws=()
for _ in 1 2 3 4 5; do bws+=("$("$BIN/llmserve-membw" "$T" "$buf" | awk '{print $2}')"); done
bw=$(printf '%s\n' "${bws[@]}" | sort -g | tail -1)
echo "read bound: $bw GB/s (the best of 5: ${bws[*]}; $buf MiB buffer, the L3 is $llc_mib MiB)"

# 2. the kernel bounds, per type and path: one thread on cache-resident weights, times T
declare -A kb
types_csv=$(echo "$TYPES" | tr ' ' ',')
isas_csv=$(echo "$isas" | tr ' ' ',')
"$BIN/llmserve-gemm-bench" --threads 1 --reps 5 --isa "$isas_csv" --type "$types_csv" --shape 64x1024 --batch 1 \
    2>/dev/null > "$OUT/l1"
while read -r ty _ _ path _ gbs; do kb[$ty.$path]=$(echo "$gbs * $T" | bc -l); done < <(awk '$1 != "type"' "$OUT/l1")
paths=$(awk '$1 != "type" {print $4}' "$OUT/l1" | sort -u | tr '\n' ' ')
[ -n "$paths" ] || { echo "no kernel path of '$isas' runs here"; exit 1; }
echo
echo "kernel bound (GB/s of weights, one thread on cache-resident weights x $T) and the lower bound of the two:"
printf '  %-6s' type; for p in $paths; do printf ' %16s' "$p"; done; echo
for ty in $TYPES; do
    printf '  %-6s' "$ty"
    for p in $paths; do
        k=${kb[$ty.$p]:-0}
        low=$(echo "if ($k < $bw) $k else $bw" | bc -l)
        printf ' %7.1f (%s %4.1f)' "$k" "$( [ "$(echo "$k < $bw" | bc -l)" = 1 ] && echo K || echo R)" "$low"
    done
    echo
done
lower() { local k=${kb[$1.$2]:-0}; echo "if ($k < $bw && $k > 0) $k else $bw" | bc -l; }

# 3. the GEMV from DRAM at the 8B FFN shapes
echo
echo "GEMV, batch 1, weights streamed from DRAM (gemm-bench --cold $buf), median of 3, $T thread(s):"
"$BIN/llmserve-gemm-bench" --threads "$T" --reps 3 --isa "$isas_csv" --type "$types_csv" \
    --shape 14336x4096,4096x14336 --batch 1 --cold "$buf" 2>/dev/null > "$OUT/cold"
while read -r ty shape _ path _ gbs; do
    low=$(lower "$ty" "$path")
    printf '  %-6s %-11s %-8s %7.1f GB/s  %3.0f%% of %.1f\n' "$ty" "$shape" "$path" "$gbs" \
        "$(echo "100 * $gbs / $low" | bc -l)" "$low"
done < <(awk '$1 != "type"' "$OUT/cold")

# 4. decode, one sequence, per shape, type and path (LLMSERVE_ISA: each path the CPU has, so an AVX-512 machine
#    also gives the AVX2 figures; DECODE_ISAS="" keeps to the engine's own choice)
echo
echo "decode, one sequence (16-token prompt, 48 tokens; the median step), dummy weights, $T thread(s):"
for shape in $SHAPES; do
    for ty in $TYPES; do
      list=${DECODE_ISAS-$isas}
      for isa in ${list:-auto}; do
        want=$isa
        [ "$isa" != auto ] || want=""
        line=$(LLMSERVE_ISA=$want "$BIN/llmserve-engine-bench" --load-format dummy --model-config "$OUT/$shape.json" \
                   --dtype "$ty" --concurrency 1 --prompt-len 16 --gen 48 --repeats 1 --system-len 16 --threads "$T" \
                   2>&1) || {
            printf '  %-15s %-6s %-12s failed: %s\n' "$shape" "$ty" "$isa" "$(echo "$line" | tail -1)"; continue; }
        path=$(echo "$line" | sed -nE 's/.*isa ([a-z0-9-]+) .*/\1/p' | head -1)
        step=$(echo "$line" | awk '$1 == 1 && NF >= 5 {print $5}')
        bytes=$(tokbytes "$shape" "$ty")
        kp=${path%-vnni}
        if [ -n "$want" ] && [ "$kp" != "$want" ]; then # LLMSERVE_ISA named a path this CPU lacks
            printf '  %-15s %-6s %-12s not on this CPU\n' "$shape" "$ty" "$isa"; continue; fi
        low=$(lower "$ty" "$kp")
        gbs=$(echo "$bytes / ($step / 1000) / 1000000000" | bc -l)
        printf '  %-15s %-6s %-12s %6.2f tok/s  %6.1f ms a step  %5.2f GB a token  %5.1f GB/s  %3.0f%% of %.1f\n' \
            "$shape" "$ty" "$path" "$(echo "1000 / $step" | bc -l)" "$step" "$(echo "$bytes / 1000000000" | bc -l)" \
            "$gbs" "$(echo "100 * $gbs / $low" | bc -l)" "$low"
      done
    done
done
fi

# 5. against llama.cpp on one file (LLAMA_BIN=/path/to/llama.cpp/build/bin, with llama-bench): a Llama-3-8B-shaped
#    GGUF of random Q4_0 weights with SmolLM2's tokenizer (tests/bench/moe_gguf.py --experts 0; 4.15 GB, made once
#    at GGUF8B), decode of 32 tokens and a 512-token prefill, REPS (default 3) runs interleaved, medians
[ -n "${LLAMA_BIN:-}" ] || exit 0
[ -x "$LLAMA_BIN/llama-bench" ] || { echo "no llama-bench in $LLAMA_BIN"; exit 1; }
G=${GGUF8B:-/tmp/llmserve-dense8b-q4_0.gguf}
if [ ! -f "$G" ]; then
    PY=${PYTHON:-$BIN/.venv-ref/bin/python}
    [ -x "$PY" ] || PY=python3
    "$PY" "$ROOT/tests/bench/moe_gguf.py" "$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf" "$G" --experts 0 \
        --layers 32 --dim 4096 --heads 32 --kv-heads 8 --expert-ffn 14336
fi
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
long=$(python3 -c "import random; random.seed(7); w='the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you were her she there been one all we their'.split(); print(' '.join(random.choice(w) for _ in range(505)))")
gen() { # PROMPT N -> "prefill_tokens prefill_tok/s decode_tok/s"
    "$BIN/llmserve" generate --model "$G" --prompt "$1" -n "$2" --ignore-eos --temperature 0 --threads "$T" 2>&1 \
        >/dev/null | sed -nE 's/.*prefill ([0-9]+) tokens at ([0-9.]+) tok\/s, decode [0-9]+ tokens at ([0-9.]+) tok\/s.*/\1 \2 \3/p'
}
lb() { # llama-bench ARGS -> avg tok/s; its failure (a build for another CPU: SIGILL) ends the bench with a word
    local rc=0
    "$LLAMA_BIN/llama-bench" -m "$G" -t "$T" -r 1 -o csv "$@" >"$OUT/lb" 2>"$OUT/lb.err" || rc=$?
    [ $rc = 0 ] || { echo "llama-bench $* failed (rc $rc): $(tail -1 "$OUT/lb.err")" >&2; exit 1; }
    python3 -c "
import csv, sys
print(list(csv.DictReader(open(sys.argv[1])))[-1]['avg_ts'])" "$OUT/lb"; }
od=(); op=(); ld=(); lp=(); np=0
for _ in $(seq "${REPS:-3}"); do
    od+=("$(gen "The quick brown fox" 32 | awk '{print $3}')")
    read -r np p _ < <(gen "$long" 1)
    op+=("$p")
    ld+=("$(lb -p 0 -n 32)")
    lp+=("$(lb -p 512 -n 0)")
done
echo
echo "against llama.cpp ($LLAMA_BIN) on $(basename "$G"), $T thread(s), medians of ${REPS:-3} interleaved runs:"
a=$(printf '%s\n' "${od[@]}" | median); b=$(printf '%s\n' "${ld[@]}" | median)
printf '  decode, 32 tokens       llmserve %6.2f tok/s  llama.cpp %6.2f tok/s  %.2fx  (runs: %s | %s)\n' "$a" "$b" \
    "$(echo "$a / $b" | bc -l)" "${od[*]}" "${ld[*]}"
a=$(printf '%s\n' "${op[@]}" | median); b=$(printf '%s\n' "${lp[@]}" | median)
printf '  prefill, %d / 512 tokens llmserve %6.1f tok/s  llama.cpp %6.1f tok/s  %.2fx  (runs: %s | %s)\n' "$np" "$a" "$b" \
    "$(echo "$a / $b" | bc -l)" "${op[*]}" "${lp[*]}"
