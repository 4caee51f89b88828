#!/usr/bin/env bash
# `llmserve bench serve` against a live `llmserve serve` on the default model:
# every request completes, the JSON has vLLM's keys, and the numbers agree.
#   run_bench_e2e.sh BUILD_DIR MODEL
set -uo pipefail
BUILD=$1
MODEL=$2
[ -f "$MODEL" ] || { echo "model $MODEL not found: run tools/setup.sh"; exit 77; }
PORT=$((20000 + ($$ * 13) % 20000))
OUT=$(mktemp -d)
"$BUILD/llmserve" serve "$MODEL" --port "$PORT" --max-model-len 1024 --kv-cache-memory 256MiB --log-level warn &
SP=$!
trap 'kill $SP 2>/dev/null; wait $SP 2>/dev/null; rm -rf "$OUT"' EXIT
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break; sleep 0.2; done
for ep in /v1/completions /v1/chat/completions; do
    "$BUILD/llmserve" bench serve --base-url "http://127.0.0.1:$PORT" --endpoint "$ep" --num-prompts 12 \
        --random-input-len 48 --random-output-len 16 --max-concurrency 4 --request-rate 20 --ignore-eos \
        --num-warmups 1 --goodput "ttft:60000 e2el:120000" --result-filename "$OUT/r.json" >"$OUT/out.txt" 2>/dev/null \
        || { echo "FAIL: bench serve exited non-zero on $ep"; cat "$OUT/out.txt"; exit 1; }
    python3 - "$OUT/r.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
keys = ["completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
        "request_goodput", "output_throughput", "total_token_throughput", "max_concurrent_requests"]
for m in ("ttft", "tpot", "itl", "e2el"):
    keys += ["mean_%s_ms" % m, "median_%s_ms" % m, "std_%s_ms" % m, "p99_%s_ms" % m]
missing = [k for k in keys if k not in r]
assert not missing, "missing keys %s" % missing
assert r["completed"] == 12 and r["failed"] == 0, r
assert r["total_output_tokens"] == 12 * 16, r["total_output_tokens"]
assert abs(r["output_throughput"] - r["total_output_tokens"] / r["duration"]) < 1e-6 * r["output_throughput"] + 1e-9
assert r["request_goodput"] <= r["request_throughput"] + 1e-9
assert 1 <= r["max_concurrent_requests"] <= 4
assert 0 < r["median_ttft_ms"] <= r["p99_ttft_ms"] and r["mean_e2el_ms"] >= r["mean_ttft_ms"]
# KV usage reaches /metrics with the next heartbeat: a short run may see 0
assert r["peak_server_memory_bytes"] > 50e6 and 0 <= r["peak_kv_cache_usage_perc"] <= 1, r
print("bench e2e %s: ok (%.1f output tok/s)" % (r["endpoint"], r["output_throughput"]))
PY
done
# ShareGPT: a good file runs its human turns; malformed ones get a clear error
cat > "$OUT/sg.json" <<'JSON'
[{"conversations": [{"from": "human", "value": "Explain how rivers shape valleys."},
                    {"from": "gpt", "value": "Rivers erode rock over long periods and carry sediment downstream."}]},
 {"conversations": [{"from": "gpt", "value": "a reply without a question"}]},
 {"conversations": [{"from": "human", "value": "Write a haiku about C."}, {"from": "gpt", "value": "Segfault at dawn."}]}]
JSON
"$BUILD/llmserve" bench serve --base-url "http://127.0.0.1:$PORT" --dataset-name sharegpt --dataset-path "$OUT/sg.json" \
    --num-prompts 4 --result-filename "$OUT/sg-r.json" >/dev/null 2>&1 || { echo "FAIL: sharegpt run"; exit 1; }
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert r['completed'] == 4 and r['failed'] == 0, r" "$OUT/sg-r.json" \
    || exit 1
for bad in '{"not": "an array"}' '[{"conversations": 5}]' 'not json'; do
    echo "$bad" > "$OUT/bad.json"
    msg=$("$BUILD/llmserve" bench serve --base-url "http://127.0.0.1:$PORT" --dataset-name sharegpt \
        --dataset-path "$OUT/bad.json" 2>&1 >/dev/null)
    rc=$?
    [ $rc = 2 ] && echo "$msg" | grep -q "bad.json" || { echo "FAIL: malformed ShareGPT '$bad': rc $rc, '$msg'"; exit 1; }
done
echo "bench e2e: sharegpt ok, malformed files refused"
