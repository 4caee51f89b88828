#!/usr/bin/env bash
# `llmserve bench serve` against a live `llmserve serve` on the default model:
# every request completes, the JSON has vLLM's keys, and the numbers agree.
#   run_bench_e2e.sh BUILD_DIR MODEL
set -uo pipefail
BUILD=$1
MODEL=$2
[ -f "$MODEL" ] || { echo "model $MODEL not found: run tools/setup.sh"; exit 77; }
PORT=$((20000 + ($$ * 13) % 12000))  # below the ephemeral range (32768+)
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
# --tokenizer: the client counts tokens with the model's tokenizer; they agree with the server's usage
"$BUILD/llmserve" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts 4 --random-input-len 40 \
    --random-output-len 12 --max-concurrency 2 --tokenizer "$MODEL" --result-filename "$OUT/tk.json" >/dev/null 2>&1 \
    || { echo "FAIL: bench with --tokenizer"; exit 1; }
python3 - "$OUT/tk.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
assert r["token_counts"] == "tokenizer" and r["completed"] == 4, r
assert abs(r["total_output_tokens"] - r["server_output_tokens"]) <= 0.05 * r["server_output_tokens"], r
assert r["total_input_tokens"] >= 4 * 40, r
print("bench e2e: --tokenizer counts %d output tokens, the server's usage %d" % (r["total_output_tokens"], r["server_output_tokens"]))
PY
# mixed: two classes of request, each reported apart; the classes' counts add up and long prompts are long
"$BUILD/llmserve" bench serve --base-url "http://127.0.0.1:$PORT" --dataset-name mixed --num-prompts 12 \
    --random-input-len 24 --random-output-len 12 --mixed-long-fraction 0.34 --mixed-long-input-len 300 \
    --mixed-long-output-len 4 --ignore-eos --max-concurrency 4 --seed 3 --result-filename "$OUT/mx.json" \
    >"$OUT/mx.txt" 2>/dev/null || { echo "FAIL: mixed run"; cat "$OUT/mx.txt"; exit 1; }
grep -q "^---- long requests: " "$OUT/mx.txt" && grep -q "^---- short requests: " "$OUT/mx.txt" \
    || { echo "FAIL: mixed run printed no per-class report"; cat "$OUT/mx.txt"; exit 1; }
python3 - "$OUT/mx.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
c = r["classes"]
assert c["short"]["completed"] + c["long"]["completed"] == r["completed"] == 12, r
assert c["long"]["completed"] >= 1 and c["short"]["completed"] >= 1, c
for k in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "p99_e2el_ms"):
    assert k in c["short"] and k in c["long"], k
assert r["total_output_tokens"] == 12 * c["short"]["completed"] + 4 * c["long"]["completed"], r
print("bench e2e: mixed ok (%d short, %d long; TTFT p50 %.0f / %.0f ms)" % (c["short"]["completed"],
      c["long"]["completed"], c["short"]["median_ttft_ms"], c["long"]["median_ttft_ms"]))
PY
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
# --sweep: one run per point, a table with the knee, the sweep JSON and an SVG plot
"$BUILD/llmserve" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts 6 --random-input-len 32 \
    --random-output-len 8 --ignore-eos --sweep max-concurrency=1,3 --result-dir "$OUT/sweep" >"$OUT/sw.txt" 2>/dev/null \
    || { echo "FAIL: sweep exited non-zero"; cat "$OUT/sw.txt"; exit 1; }
grep -q "^Knee: " "$OUT/sw.txt" || { echo "FAIL: sweep printed no knee"; cat "$OUT/sw.txt"; exit 1; }
python3 - "$OUT/sweep" <<'PY' || exit 1
import json, sys, xml.etree.ElementTree as ET
d = sys.argv[1]
s = json.load(open(d + "/sweep-max-concurrency.json"))
pts = s["points"]
assert s["sweep"] == "max-concurrency" and len(pts) == 2, s
assert [p["sweep_value"] for p in pts] == [1, 3] and [p["max_concurrency"] for p in pts] == [1, 3]
assert all(p["completed"] == 6 and p["failed"] == 0 and p["total_output_tokens"] == 48 for p in pts), pts
assert pts[0]["max_concurrent_requests"] == 1 and pts[1]["max_concurrent_requests"] <= 3
assert s["knee_index"] in (0, 1) and s["knee_value"] == pts[s["knee_index"]]["sweep_value"], s
# the knee rule, checked from the points themselves
gain = pts[1]["output_throughput"] / pts[0]["output_throughput"] - 1
want = 0 if gain < s["min_gain"] and pts[1]["p99_e2el_ms"] > pts[0]["p99_e2el_ms"] else 1
assert s["knee_index"] == want and s["knee_reached"] == (want == 0), (s["knee_index"], gain)
svg = ET.parse(d + "/sweep-max-concurrency.svg").getroot()
assert svg.tag.endswith("svg")
assert len([e for e in svg.iter() if e.tag.endswith("circle")]) == 2
print("bench e2e: sweep ok (knee at max-concurrency=%g, gain %.0f%%)" % (s["knee_value"], gain * 100))
PY
# a saved sweep redraws; a file that is not one is refused
"$BUILD/llmserve" bench plot "$OUT/sweep/sweep-max-concurrency.json" "$OUT/re.svg" \
    && python3 -c "import sys, xml.etree.ElementTree as E; r = E.parse(sys.argv[1]).getroot(); \
assert len([e for e in r.iter() if e.tag.endswith('circle')]) == 2" "$OUT/re.svg" \
    || { echo "FAIL: bench plot"; exit 1; }
"$BUILD/llmserve" bench plot "$OUT/r.json" "$OUT/no.svg" 2>/dev/null
[ $? = 2 ] || { echo "FAIL: bench plot accepted a non-sweep file"; exit 1; }
for bad in "max-concurrency=4,2" "max-concurrency=1" "request-rate=x" "batch-size=1,2"; do
    msg=$("$BUILD/llmserve" bench serve --base-url "http://127.0.0.1:$PORT" --sweep "$bad" 2>&1 >/dev/null)
    rc=$?
    [ $rc = 2 ] && echo "$msg" | grep -q -- "--sweep" || { echo "FAIL: --sweep '$bad': rc $rc, '$msg'"; exit 1; }
done
# Ctrl-C: stops at once, still reports and saves what finished, exit 130
"$BUILD/llmserve" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts 200 --random-input-len 32 \
    --random-output-len 64 --ignore-eos --max-concurrency 2 --result-filename "$OUT/int.json" >"$OUT/int.txt" 2>"$OUT/int.err" &
BP=$!
for _ in $(seq 1 600); do grep -qE ' [1-9][0-9]*/200 requests' "$OUT/int.err" && break; sleep 0.1; done
sleep 0.3
kill -INT $BP
wait $BP
rc=$?
[ $rc = 130 ] || { echo "FAIL: Ctrl-C exit $rc, want 130"; cat "$OUT/int.txt" "$OUT/int.err"; exit 1; }
python3 - "$OUT/int.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
assert r["completed"] >= 1 and r["failed"] == 0, r
assert r["completed"] + r["interrupted"] == 200, r
assert r["total_output_tokens"] == 64 * r["completed"], r
print("bench e2e: Ctrl-C ok (%d finished, %d interrupted)" % (r["completed"], r["interrupted"]))
PY
