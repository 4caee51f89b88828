#!/usr/bin/env bash
# CPU speed of the default model on every SIMD path this CPU has, in the
# shapes users meet, each beside the machine's bound it is a fraction of:
#   decode    128 tokens after a 5-token prompt           (bound: read bandwidth / model bytes)
#   prefill   a 1,100-token prompt                        (bound: int8 MAC ceiling / MACs a token)
#   decode    64 tokens after that prompt                 (bandwidth bound; attention reads the KV too)
#   batch     32 sequences, 200-token prompts -> 128 each (llmserve-engine-bench: generated tok/s)
#   serve     32 streams through `llmserve serve`         (SERVE=1: llmserve bench serve, output tok/s, TTFT p50)
# and first the Q4_1 GEMM alone per path (llmserve-gemm-bench) against the same bounds.
# Medians of REPS runs, ours and llama.cpp's interleaved when given:
#   LLAMA_BIN=/path/to/llama.cpp/build/bin   runs llama-bench, llama-batched-bench (-fa on)
#                                            and with SERVE=1 llama-server (-np 32 -fa on)
# A benchmark, not a test.
#
#   tests/bench/cpu_bench.sh [MODEL] [REPS]       THREADS (default 2), ISAS (default: all present)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${BUILD_DIR:-$ROOT/build}
MODEL=${1:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
REPS=${2:-3}
T=${THREADS:-2}
LB=${LLAMA_BIN:-}
[ -x "$BIN/llmserve" ] || { echo "build first (tools/setup.sh build)"; exit 1; }
[ -f "$MODEL" ] || { echo "no model at $MODEL (tools/setup.sh fetches the default)"; exit 1; }

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
words() { python3 -c "import random; random.seed($2); w='the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you were her she there been one all we their'.split(); print(' '.join(random.choice(w) for _ in range($1)))"; }

# MACs a token spends in the weights: every 2-D weight but the embedding
# lookup (which is the output head too when the model ties them).
macs=$(python3 - "$MODEL" <<'EOF'
import struct, sys
f = open(sys.argv[1], 'rb')
def rd(fmt): return struct.unpack('<' + fmt, f.read(struct.calcsize('<' + fmt)))
def s(): n, = rd('Q'); return f.read(n).decode('utf-8', 'replace')
SZ = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip(t):
    if t == 8: s()
    elif t == 9:
        et, n = rd('IQ')
        for _ in range(n): skip(et)
    else: f.read(SZ[t])
magic, ver, nt, nkv = rd('IIQQ')
for _ in range(nkv): s(); t, = rd('I'); skip(t)
tot, emb, head = 0, 0, False
for _ in range(nt):
    name = s(); nd, = rd('I'); dims = rd('Q' * nd); rd('IQ')
    n = 1
    for d in dims: n *= d
    if nd != 2: continue
    if name == 'token_embd.weight': emb = n; continue
    head |= name == 'output.weight'
    tot += n
print(tot + (0 if head else emb))
EOF
)
bytes=$(stat -c %s "$MODEL")
bw=$("$BIN/llmserve-membw" "$T" 1024 | awk '{print $2}')
declare -A peak
while read -r _ p v; do peak[$p]=$v; done < <("$BIN/llmserve-membw" "$T" int8)
printf 'model %s: %.1f MB, %.1f M MACs a token; %s thread(s); %s\n' "$(basename "$MODEL")" \
    "$(echo "$bytes/1000000" | bc -l)" "$(echo "$macs/1000000" | bc -l)" "$T" "$(lscpu | sed -n 's/^Model name: *//p')"
printf 'bounds: read %s GB/s (1 GiB buffer) -> decode <= %.0f tok/s; int8 MAC ceilings GMAC/s: %s\n' \
    "$bw" "$(echo "$bw*1000000000/$bytes" | bc -l)" "$(for p in "${!peak[@]}"; do printf '%s %s  ' "$p" "${peak[$p]}"; done)"

if [ -n "${ISAS:-}" ]; then isas=$ISAS
elif [ "$(uname -m)" = aarch64 ]; then isas="neon-dotprod neon"
else isas="avx512 avx2"; fi
short="The quick brown fox jumps"
long=$(words 1100 1)

gen() { # ISA PROMPT N -> "prefill_tok/s decode_tok/s isa_used"
    LLMSERVE_ISA=$1 "$BIN/llmserve" generate --model "$MODEL" --prompt "$2" -n "$3" --ignore-eos --temperature 0 \
        --threads "$T" 2>&1 >/dev/null | sed -nE 's/.*prefill [0-9]+ tokens at ([0-9.]+) tok\/s, decode [0-9]+ tokens at ([0-9.]+) tok\/s \([0-9]+ threads?, ([a-z0-9-]+)\).*/\1 \2 \3/p'
}
lbench() { # llama-bench ARGS -> avg tok/s
    "$LB/llama-bench" -m "$MODEL" -t "$T" -r 1 -o csv "$@" 2>/dev/null | python3 -c "
import csv, sys
print(list(csv.DictReader(sys.stdin))[-1]['avg_ts'])"
}

row() { # LABEL ENGINE VALUE BOUND UNIT
    if [ "$4" != 0 ] && [ -n "$4" ]; then
        printf '  %-34s %-10s %9.1f %-8s (%4.0f%% of %.0f)\n' "$1" "$2" "$3" "$5" "$(echo "100*$3/$4" | bc -l)" "$4"
    else printf '  %-34s %-10s %9.1f %-8s\n' "$1" "$2" "$3" "$5"; fi
}
ratio() { printf '  %-34s %-10s %9.2fx\n' "" "ratio" "$(echo "$1/$2" | bc -l)"; }

# the peak that bounds a path's prefill: its multiply instruction
pk() { case $1 in avx512) echo "${peak[avx512-vnni]:-${peak[avx512]:-0}}";; avx2) echo "${peak[avx2]:-0}";; *) echo 0;; esac; }
dbound=$(echo "$bw*1000000000/$bytes" | bc -l)

# The GEMM alone (llmserve-gemm-bench): at B = 1 a 16384x4096 matrix (42 MB, past a 32 MiB L3 as the
# model is) in GB/s against the read bound; at batches the model's gate/up shape in GMAC/s against
# the path's int8 ceiling.
if [ -x "$BIN/llmserve-gemm-bench" ]; then
    amx=; case " $isas " in *" avx512 "*) amx=,avx512-amx ;; esac # AVX-512 alone and with AMX tiles, where present
    echo "gemm alone, Q4_1, $T thread(s), median of 5:"
    { "$BIN/llmserve-gemm-bench" --threads "$T" --reps 5 --isa "${isas// /,}" --type q4_1 --shape 16384x4096 \
          --batch 1 2>/dev/null
      "$BIN/llmserve-gemm-bench" --threads "$T" --reps 5 --isa "${isas// /,}${amx}" --type q4_1 --shape 1536x576 \
          --batch 32,151 2>/dev/null; } | awk -v bw="$bw" -v a2="$(pk avx2)" -v a5="$(pk avx512)" '
        $1 == "type" { next }
        { c = ($4 == "avx2") ? a2 : ($4 == "avx512") ? a5 : 0
          if ($3 == 1) printf "  %-8s %-11s B=%-4s %7.1f GB/s (%3.0f%% of %.1f)\n", $4, $2, $3, $6, 100 * $6 / bw, bw
          else if (c > 0) printf "  %-8s %-11s B=%-4s %7.1f GMAC/s (%3.0f%% of %.0f)\n", $4, $2, $3, $5, 100 * $5 / c, c
          else printf "  %-8s %-11s B=%-4s %7.1f GMAC/s\n", $4, $2, $3, $5 }'
fi

for isa in $isas; do
    probe=$(gen "$isa" "$short" 2 | awk '{print $3}')
    if [ "$probe" != "$isa" ]; then echo "== $isa: not on this CPU, skipped"; continue; fi
    pbound=$(echo "$(pk "$isa")*1000000000/$macs" | bc -l)
    d0=(); pf=(); d1=(); ld0=(); lpf=(); ld1=()
    for r in $(seq "$REPS"); do
        d0+=("$(gen "$isa" "$short" 128 | awk '{print $2}')")
        read -r a b _ < <(gen "$isa" "$long" 64)
        pf+=("$a"); d1+=("$b")
        if [ -n "$LB" ]; then
            ld0+=("$(lbench -p 0 -n 128)"); lpf+=("$(lbench -p 1100 -n 0)"); ld1+=("$(lbench -p 0 -n 64 -d 1100)")
        fi
    done
    echo "== $isa (LLMSERVE_ISA=$isa)${LB:+; llama.cpp from $LB}"
    m=$(printf '%s\n' "${d0[@]}" | median); row "decode, 5-token prompt" llmserve "$m" "$dbound" tok/s
    if [ -n "$LB" ]; then l=$(printf '%s\n' "${ld0[@]}" | median); row "" llama.cpp "$l" "$dbound" tok/s; ratio "$m" "$l"; fi
    m=$(printf '%s\n' "${pf[@]}" | median); row "prefill, 1,100-token prompt" llmserve "$m" "$pbound" tok/s
    if [ -n "$LB" ]; then l=$(printf '%s\n' "${lpf[@]}" | median); row "" llama.cpp "$l" "$pbound" tok/s; ratio "$m" "$l"; fi
    m=$(printf '%s\n' "${d1[@]}" | median); row "decode after that prompt" llmserve "$m" "$dbound" tok/s
    if [ -n "$LB" ]; then l=$(printf '%s\n' "${ld1[@]}" | median); row "" llama.cpp "$l" "$dbound" tok/s; ratio "$m" "$l"; fi

    eb=$(LLMSERVE_ISA=$isa "$BIN/llmserve-engine-bench" --model "$MODEL" --concurrency 32 --prompt-len 200 --gen 128 \
         --threads "$T" 2>&1 | awk '$1 == 32 {print $2}')
    row "32 sequences, 200 -> 128 tokens" llmserve "$eb" "" "tok/s"
    if [ -n "$LB" ]; then
        lt=$("$LB/llama-batched-bench" -m "$MODEL" -t "$T" -c 16384 -npp 200 -ntg 128 -npl 32 -fa on 2>/dev/null |
             awk -F'|' '$4+0 == 32 {print 32*128/$10}')
        row "  (llama-batched-bench, generated)" llama.cpp "$lt" "" "tok/s"; ratio "$eb" "$lt"
    fi

    if [ "${SERVE:-0}" = 1 ]; then
        serve_bench() { # URL -> "output_tok/s ttft_p50_ms"
            "$BIN/llmserve" bench serve --base-url "$1" --tokenizer "$MODEL" --num-prompts "${SERVE_PROMPTS:-96}" \
                --max-concurrency 32 --random-input-len 150 --random-output-len 128 --ignore-eos 2>/dev/null |
                awk '/^Request throughput/ {o=$6} /^ttft/ {t=$9} END {print o, t}'
        }
        port=$((18000 + RANDOM % 1000))
        LLMSERVE_ISA=$isa "$BIN/llmserve" serve "$MODEL" --threads "$T" --port "$port" >/tmp/cpu_bench_serve.$$ 2>&1 &
        spid=$!
        for _ in $(seq 60); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
        read -r so st < <(serve_bench "http://127.0.0.1:$port")
        kill -INT "$spid"; wait "$spid" 2>/dev/null || true
        rm -f /tmp/cpu_bench_serve.$$
        row "serve 32 streams, 150 words -> 128" llmserve "$so" "" "tok/s"; printf '  %-34s %-10s %9.0f ms TTFT p50\n' "" "" "$st"
        if [ -n "$LB" ]; then
            "$LB/llama-server" -m "$MODEL" -t "$T" -np 32 -fa on -c 16384 --port "$((port + 1))" >/dev/null 2>&1 &
            lpid=$!
            for _ in $(seq 60); do curl -sf "http://127.0.0.1:$((port + 1))/health" >/dev/null && break; sleep 1; done
            read -r lo lt2 < <(serve_bench "http://127.0.0.1:$((port + 1))")
            kill "$lpid"; wait "$lpid" 2>/dev/null || true
            row "  (llama-server -np 32 -fa on)" llama.cpp "$lo" "" "tok/s"; printf '  %-34s %-10s %9.0f ms TTFT p50\n' "" "" "$lt2"
            ratio "$so" "$lo"
        fi
    fi
done
