#!/usr/bin/env bash
# AWQ and GPTQ checkpoints end to end. No real one can be fetched here, so
# the default model is written as a float Hugging Face directory
# (tests/ref/gguf_to_hf.py) and packed by tests/ref/hf_quant.py, numpy
# written from the formats' specifications: AWQ 4-bit (asymmetric, groups of
# 64), GPTQ 4-bit act-order (symmetric, v1 zeros), GPTQ 8-bit per channel
# (v1), GPTQ 4-bit asymmetric with v2 zeros (groups of 32). Each is also
# unpacked to F32 by that script's numpy unpacker, and then:
#   hfq_test      our conversion of every layer against the unpacking, and
#                 the two models' logits and greedy tokens (float activations)
#   llmserve eval the checkpoint on the int8 path against the unpacking:
#                 what the activations cost on top of the weights (bounded)
#   generate      the checkpoint serves text; configs we do not run are
#                 refused with their name
#   run_hf_quant_e2e.sh BUILD_DIR MODEL [quick]
# quick (the sanitizer build): act-order GPTQ only (hfq_test packs every variant in C), no eval.
set -uo pipefail
BUILD=$1
MODEL=$2
QUICK=${3:-}
HERE=$(cd "$(dirname "$0")" && pwd)
TEXT="$HERE/../data/eval_text.txt"
[ -f "$MODEL" ] || { echo "model $MODEL not found: run tools/setup.sh"; exit 77; }
VENV="$BUILD/.venv-ref"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import gguf, safetensors, numpy" 2>/dev/null; then
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >/dev/null 2>&1 || { echo "python3 venv unavailable"; exit 77; }
    "$VENV/bin/pip" install -q gguf safetensors numpy >/dev/null 2>&1 ||
        { echo "pip install gguf safetensors numpy failed (offline?)"; exit 77; }
fi
OUT=$(mktemp -d "$BUILD/hfq-e2e.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
L="$BUILD/llmserve"
PY="$VENV/bin/python"
"$PY" "$HERE/../ref/gguf_to_hf.py" "$MODEL" "$OUT/f32" --dtype f32 2>/dev/null || fail "gguf_to_hf"
# name, packing flags, the block type it loads as, act-order, KL bound of the int8 path against the unpacking
SPECS=("awq|--method awq --group 64|Q4_1|0|0.01"
       "gptq-act|--method gptq --group 64 --act-order|Q4_0|1|0.01"
       "gptq8|--method gptq --bits 8 --group -1|Q8_0|0|0.01"
       "gptq-v2|--method gptq --group 32 --asym --v2|Q4_1|0|0.01")
[ -n "$QUICK" ] && SPECS=("${SPECS[1]}")
for spec in "${SPECS[@]}"; do
    IFS='|' read -r name flags type act kl <<<"$spec"
    "$PY" "$HERE/../ref/hf_quant.py" pack "$OUT/f32" "$OUT/$name" $flags || fail "pack $name"
    "$PY" "$HERE/../ref/hf_quant.py" unpack "$OUT/$name" "$OUT/$name-ref" || fail "unpack $name"
    "$BUILD/tests/hfq_test" "$OUT/$name" "$OUT/$name-ref" "$type" "$act" || fail "hfq_test $name"
    if [ -z "$QUICK" ]; then
        "$L" eval --model "$OUT/$name" --ref "$OUT/$name-ref" --ref-act-f32 --file "$TEXT" --max-tokens 256 \
            --no-speed --no-tasks --threads 2 --check-kl "$kl" --check-top1 0.88 >"$OUT/eval.log" 2>&1 ||
            { cat "$OUT/eval.log"; fail "eval $name against its unpacking"; }
        echo "$name against its unpacking, int8 activations: $(sed -n 3p "$OUT/eval.log")"
    fi
    g=$("$L" generate --model "$OUT/$name" --prompt "The capital of France is" -n 8 --temperature 0 --threads 2 2>"$OUT/gen.log")
    [ -n "$g" ] || { cat "$OUT/gen.log"; fail "generate from $name printed nothing"; }
    echo "$name ($type): generate '$g'"
    rm -rf "$OUT/$name-ref"
    [ "$name" = gptq-act ] || rm -rf "$OUT/$name"
done
# configs and layers we do not run are refused with their name, not run wrong
refuse() { # dir, python edit of config.json (c), what the error must say
    rm -rf "$OUT/bad" && cp -r "$OUT/gptq-act" "$OUT/bad"
    "$PY" - "$OUT/bad/config.json" "$2" <<'PYX'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
exec(sys.argv[2])
json.dump(c, open(p, "w"))
PYX
    msg=$("$L" generate --model "$OUT/bad" --prompt hi -n 1 --threads 2 2>&1 >/dev/null) && fail "$1: loaded"
    echo "$msg" | grep -q -- "$3" || fail "$1: error '$msg' does not say '$3'"
    echo "refused ($1): $(echo "$msg" | tail -1)"
}
msg=$("$L" generate --model "$OUT/gptq-act" --quantization awq --prompt hi -n 1 --threads 2 2>&1 >/dev/null) &&
    fail "--quantization awq ran a GPTQ checkpoint"
echo "$msg" | grep -q "not an AWQ checkpoint" || fail "--quantization awq on GPTQ: '$msg'"
"$L" generate --model "$OUT/gptq-act" --quantization gptq --prompt hi -n 1 --threads 2 >/dev/null 2>&1 ||
    fail "--quantization gptq refused a GPTQ checkpoint"
# act-order under tensor parallelism: o_proj / down_proj cannot be split by input columns; serve stops
# with the reason instead of restarting the worker group forever
PORT=$((20000 + RANDOM % 20000))
timeout 120 "$L" serve "$OUT/gptq-act" --tensor-parallel-size 2 --threads 1 --port "$PORT" >"$OUT/serve.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q "cannot be split by input columns" "$OUT/serve.log" && grep -q "its model (exit 2); stopping" "$OUT/serve.log" ||
    { cat "$OUT/serve.log"; fail "serve with act-order and --tensor-parallel-size 2: exit $rc"; }
echo "refused (act-order, tensor parallel): serve exited 2 naming the reason"
refuse "bitsandbytes" 'c["quantization_config"]["quant_method"] = "bitsandbytes"' "bitsandbytes"
refuse "3-bit" 'c["quantization_config"]["bits"] = 3' "bits 3"
refuse "marlin" 'c["quantization_config"]["checkpoint_format"] = "marlin"' "marlin"
refuse "wrong group" 'c["quantization_config"]["group_size"] = 32' "do not fit"
refuse "as AWQ" 'c["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 64}' "g_idx"
exit 0
