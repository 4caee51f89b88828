#!/usr/bin/env bash
# --load-format dummy on the worker: bad combinations are refused with a
# clear line (exit 2; an unknown preset exits 1 naming the presets), and a
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
expect 1 "presets: llama-2-7b" -- --load-format dummy --model-config no-such-model
echo '{"hidden_size": 64}' > "$OUT/bad.json"
expect 1 "needs num_hidden_layers" -- --load-format dummy --model-config "$OUT/bad.json"
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
