#!/usr/bin/env bash
# Starts real workers and gateways on loopback and runs test_gateway.py with
# the `openai` client (installed into a venv in the build folder).
#   run_gateway_e2e.sh BUILD_DIR MODEL
# Exit 77 (skipped) when the model or the openai package cannot be had.
set -uo pipefail
BUILD=$1
MODEL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f "$MODEL" ] || { echo "model $MODEL not found: run tools/setup.sh"; exit 77; }
VENV="$BUILD/.venv-e2e"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import openai" 2>/dev/null; then
    python3 -m venv "$VENV" >/dev/null 2>&1 || { echo "python3 venv unavailable"; exit 77; }
    "$VENV/bin/pip" install -q openai >/dev/null 2>&1 || { echo "pip install openai failed (offline?)"; exit 77; }
fi
# the response shapes' validator (test_gateway.py says so and goes on without it)
"$VENV/bin/python" -c "import jsonschema" 2>/dev/null || "$VENV/bin/pip" install -q jsonschema >/dev/null 2>&1 || true
BASE=$((20000 + $$ % 12000))  # below the ephemeral range (32768+): a client socket can hold a port up there
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
W="--model $MODEL --kv-cache-memory 512MiB --max-model-len 2048 --log-level warn"
"$BUILD/llmserve-worker" $W --listen tcp://127.0.0.1:$((BASE)) & PIDS+=($!)
"$BUILD/llmserve-worker" $W --listen tcp://127.0.0.1:$((BASE + 1)) --threads 1 & WA=$!; PIDS+=($WA)
"$BUILD/llmserve-worker" $W --listen tcp://127.0.0.1:$((BASE + 2)) --threads 1 & WB=$!; PIDS+=($WB)
G="--model $MODEL --api-key k-test --log-level warn --header-timeout 5"
"$BUILD/llmserve-gateway" $G --port $((BASE + 10)) --workers tcp://127.0.0.1:$BASE & PIDS+=($!)
"$BUILD/llmserve-gateway" $G --port $((BASE + 11)) --workers tcp://127.0.0.1:$BASE --request-timeout 1 & PIDS+=($!)
"$BUILD/llmserve-gateway" $G --port $((BASE + 12)) --workers tcp://127.0.0.1:$BASE --rate-limit-rps 0.5 & PIDS+=($!)
"$BUILD/llmserve-gateway" $G --port $((BASE + 14)) --workers tcp://127.0.0.1:$BASE --max-queue 4 & GS=$!; PIDS+=($GS)
"$BUILD/llmserve-gateway" $G --port $((BASE + 15)) --workers tcp://127.0.0.1:$((BASE + 1)),tcp://127.0.0.1:$((BASE + 2)) \
    --routing round-robin & PIDS+=($!)
"$BUILD/llmserve-gateway" $G --port $((BASE + 13)) --workers tcp://127.0.0.1:$((BASE + 1)),tcp://127.0.0.1:$((BASE + 2)) \
    --route-lambda 4 & PIDS+=($!)
for port in $((BASE + 10)) $((BASE + 11)) $((BASE + 12)) $((BASE + 13)) $((BASE + 14)) $((BASE + 15)); do
    for _ in $(seq 1 300); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 0.2
    done
done
# the two-group gateways need both groups up
for port in $((BASE + 13)) $((BASE + 15)); do
    for _ in $(seq 1 300); do
        [ "$(curl -s "http://127.0.0.1:$port/health" | grep -o '"workers_up":2')" ] && break
        sleep 0.2
    done
done
# curl sees the raw SSE framing: data: lines, a blank line after each, [DONE] last
SSE=$(curl -sN -H "Authorization: Bearer k-test" "http://127.0.0.1:$((BASE + 10))/v1/chat/completions" \
    -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"stream":true}')
echo "$SSE" | grep -v '^$' | grep -qv '^data: ' && { echo "FAIL: SSE line not data:"; exit 1; }
[ "$(echo "$SSE" | grep -v '^$' | tail -n 1)" = "data: [DONE]" ] || { echo "FAIL: SSE does not end with [DONE]"; exit 1; }
[ "$(echo "$SSE" | grep -c '^data: ')" -ge 3 ] || { echo "FAIL: too few SSE events"; exit 1; }
echo "curl: SSE framing ok"
GW=http://127.0.0.1:$((BASE + 10)) GW_TIMEOUT=http://127.0.0.1:$((BASE + 11)) GW_RATE=http://127.0.0.1:$((BASE + 12)) \
GW2=http://127.0.0.1:$((BASE + 13)) GW_RR=http://127.0.0.1:$((BASE + 15)) W2PIDS=$WA,$WB GW_SMALL=http://127.0.0.1:$((BASE + 14)) GW_SMALL_PID=$GS KEY=k-test "$VENV/bin/python" "$HERE/test_gateway.py"
