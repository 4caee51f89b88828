#!/usr/bin/env bash
# The quantization table of docs/quantization.md: each format made from SOURCE by `llmserve quantize`,
# then `llmserve eval` against SOURCE on tests/data/eval_text.txt. Quality columns (PPL, KL, top-1, tasks)
# with float activations on both sides, so they are the weights' cost alone; speed columns on the
# production path (int8 activation blocks). Two extra rows: SOURCE with an FP8 KV cache, and SOURCE's
# int8 activation path against its float one.
#   tests/bench/quant_table.sh BUILD_DIR SOURCE.gguf [TYPES...]   (markdown on stdout)
set -uo pipefail
BUILD=$1
SRC=$2
shift 2
TYPES=("$@")
[ ${#TYPES[@]} -gt 0 ] || TYPES=(F16 Q8_0 Q6_K Q5_K_M Q4_K_M Q4_1 Q4_0 Q3_K_M Q2_K)
HERE=$(cd "$(dirname "$0")" && pwd)
TEXT="$HERE/../data/eval_text.txt"
L="$BUILD/llmserve"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
q() { "$L" eval --file "$TEXT" --max-tokens 512 --json "$@"; }
row() { # name quality.json speed.json
    python3 - "$1" "$2" "$3" <<'PY'
import json, sys
name, qj, sj = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
m, s = qj["model"], sj["model"]
print(f"| {name} | {m['size_mb']:.1f} | {m['bits_per_weight']:.2f} | {s['prefill_tok_s']:.0f} | {s['decode_tok_s']:.1f} | "
      f"{m['perplexity']:.2f} | {qj['kl_mean']:.4f} | {qj['kl_p99']:.3f} | {100 * qj['top1']:.1f}% | {m['tasks']}/{m['tasks_of']} |")
PY
}
echo "| format | size MB | bits/weight | prefill tok/s | decode tok/s | PPL | KL mean | KL p99 | top-1 | tasks |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for T in "${TYPES[@]}"; do
    "$L" quantize "$SRC" "$TMP/m.gguf" --type "$T" >/dev/null 2>&1 || { echo "| $T | (quantize failed) |"; continue; }
    q --model "$TMP/m.gguf" --ref "$SRC" --act-f32 --ref-act-f32 --no-speed >"$TMP/q.json" &&
        q --model "$TMP/m.gguf" --ref "$SRC" --no-tasks --max-tokens 64 >"$TMP/s.json" && row "$T" "$TMP/q.json" "$TMP/s.json"
done
name=$(basename "$SRC" .gguf)
q --model "$SRC" --act-f32 --ref-act-f32 --no-speed >"$TMP/q.json" && q --model "$SRC" --no-tasks --max-tokens 64 >"$TMP/s.json" &&
    row "source ($name)" "$TMP/q.json" "$TMP/s.json"
q --model "$SRC" --kv-cache-dtype fp8 --no-speed >"$TMP/q.json" &&
    q --model "$SRC" --kv-cache-dtype fp8 --no-tasks --max-tokens 64 >"$TMP/s.json" && row "source, FP8 KV cache (vs F16)" "$TMP/q.json" "$TMP/s.json"
q --model "$SRC" --ref-act-f32 --no-speed >"$TMP/q.json" && cp "$TMP/q.json" "$TMP/s.json" &&
    q --model "$SRC" --no-tasks --max-tokens 64 >"$TMP/s.json" && row "source, int8 activations (vs float)" "$TMP/q.json" "$TMP/s.json"
echo
echo "ISA: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["isa"])' "$TMP/s.json"), $(nproc) threads; text: tests/data/eval_text.txt, first 512 tokens, windows of 256"
