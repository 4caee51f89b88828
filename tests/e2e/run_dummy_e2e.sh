#!/usr/bin/env bash
# --load-format dummy on the worker: bad combinations are refused with a
# clear line (exit 2; an unknown preset names the presets), and a
# dummy worker of a real shape starts, sizes its KV cache and serves until
# SIGTERM, with no checkpoint on disk.
#   run_dummy_e2e.sh BUILD_DIR
set -uo pipefail
W=$1/llmserve-worker
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
expect() { # rc pattern -- args
    local rc=$1 pat=$2
    shift 3
    "$W" "$@" >"$OUT/o" 2>&1
    local got=$?
    [ $got = "$rc" ] && grep -q -- "$pat" "$OUT/o" || { echo "FAIL: $* -> rc $got: $(cat "$OUT/o")"; exit 1; }
}
expect 2 "needs --model-config" -- --load-format dummy
expect 2 "add --load-format dummy" -- --model-config llama-3-8b
expect 2 "load-format expects auto or dummy" -- --load-format safetensors
expect 2 "dtype expects" -- --load-format dummy --model-config smollm2-135m --dtype q9_9
# K-quant dummies need whole 256-blocks in every row (SmolLM2's dim is 576)
expect 2 "Q4_K needs dim, heads x head_dim and FFN size in multiples of 256" -- --load-format dummy \
    --model-config smollm2-135m --dtype q4_k
expect 2 "unknown model preset 'no-such-model' (presets: gpt-oss-20b" -- --load-format dummy --model-config no-such-model
echo '{"hidden_size": 64}' > "$OUT/bad.json"
expect 2 "needs num_hidden_layers" -- --load-format dummy --model-config "$OUT/bad.json"
# a valid but absurd shape (about 280 TB) is refused before any memory is touched
echo '{"num_hidden_layers": 1024, "hidden_size": 65536, "num_attention_heads": 512, "intermediate_size": 262144,
       "vocab_size": 1000}' > "$OUT/huge.json"
expect 1 "more than this machine's" -- --load-format dummy --model-config "$OUT/huge.json"
expect 1 "TB\\|GiB in F32" -- --load-format dummy --model-config "$OUT/huge.json" --dtype f32   # f32 is honoured (its enum is 0)
"$W" --load-format dummy --model-config smollm2-135m --dtype q4_0 --listen "ipc://$OUT/w.ipc" --max-model-len 512 \
    --kv-cache-memory 64MiB --log-level info >"$OUT/log" 2>&1 &
P=$!
for _ in $(seq 1 100); do grep -q "KV cache" "$OUT/log" && break; sleep 0.2; done
sleep 0.5
kill -TERM $P
wait $P
rc=$?
grep -q "model dummy:smollm2-135m: llama, 30 layers" "$OUT/log" && grep -q "KV cache" "$OUT/log" && [ $rc = 0 ] \
    || { echo "FAIL: dummy worker (rc $rc)"; cat "$OUT/log"; exit 1; }
echo "dummy e2e: refusals clear, dummy smollm2-135m worker started and stopped cleanly"
# K-quant dummies (the roofline bench's Q4_K and Q6_K decode) of a shape in whole 256-blocks generate
echo '{"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
       "intermediate_size": 512, "vocab_size": 1000}' > "$OUT/k.json"
for t in q4_k q6_k; do
    "$1/llmserve" generate --load-format dummy --model-config "$OUT/k.json" --dtype $t --prompt hi --max-tokens 4 \
        --ignore-eos --temperature 0 >"$OUT/o" 2>&1 && grep -q "decode 4 tokens" "$OUT/o" \
        || { echo "FAIL: dummy $t generate: $(cat "$OUT/o")"; exit 1; }
done
echo "dummy e2e: dummy Q4_K and Q6_K weights generate"
G=$1/llmserve-gateway
"$G" --load-format dummy >"$OUT/o" 2>&1; rc=$?
[ $rc = 2 ] && grep -q "go together" "$OUT/o" || { echo "FAIL: gateway --load-format dummy alone: rc $rc"; exit 1; }
# the whole serving stack on dummy weights: gateway and worker share the stand-in tokenizer
PORT=$((20000 + ($$ * 17) % 12000))  # below the ephemeral range (32768+)
"$1/llmserve" serve --load-format dummy --model-config smollm2-135m --dtype q4_0 --port "$PORT" --max-model-len 512 \
    --kv-cache-memory 64MiB --log-level warn >"$OUT/serve.log" 2>&1 &
SP=$!
for _ in $(seq 1 150); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break; sleep 0.2; done
R=$(curl -s "http://127.0.0.1:$PORT/v1/completions" -d '{"model": "dummy-smollm2-135m", "prompt": "hello", "max_tokens": 4, "ignore_eos": true}')
"$1/llmserve" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts 4 --random-input-len 16 --random-output-len 4 \
    --ignore-eos --max-concurrency 2 --result-filename "$OUT/b.json" >/dev/null 2>&1
brc=$?
kill $SP; wait $SP 2>/dev/null
echo "$R" | python3 -c "import json,sys; r=json.load(sys.stdin); assert r['usage']['completion_tokens'] == 4 and r['model'] == 'dummy-smollm2-135m', r" \
    && [ $brc = 0 ] && python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['completed'] == 4 and r['total_output_tokens'] == 16, r" "$OUT/b.json" \
    || { echo "FAIL: llmserve serve on dummy weights: $R (bench rc $brc)"; cat "$OUT/serve.log"; exit 1; }
echo "dummy e2e: llmserve serve --load-format dummy answers the OpenAI API and the bench"
