#!/usr/bin/env bash
# `llmserve serve`: answers, restarts a killed worker, stops everything on SIGTERM.
#   run_serve_e2e.sh BUILD_DIR MODEL
set -uo pipefail
BUILD=$1
MODEL=$2
[ -f "$MODEL" ] || { echo "model $MODEL not found: run tools/setup.sh"; exit 77; }
PORT=$((20000 + ($$ * 7) % 12000))  # below the ephemeral range (32768+)
fail() { echo "FAIL: $*"; kill "$SP" 2>/dev/null; exit 1; }
ask() { curl -s -m 30 "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt":"Hello","max_tokens":3,"temperature":0}'; }
"$BUILD/llmserve" serve "$MODEL" --port "$PORT" --max-model-len 1024 --kv-cache-memory 256MiB --log-level warn &
SP=$!
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break; sleep 0.2; done
ask | grep -q '"completion_tokens":3' || fail "no answer from llmserve serve"
WPID=$(pgrep -P "$SP" -f llmserve-worker) || fail "no worker child"
kill -9 "$WPID"
ok=0
for _ in $(seq 1 100); do
    sleep 0.3
    if ask | grep -q '"completion_tokens":3'; then ok=1; break; fi
done
[ $ok = 1 ] || fail "no answer after the worker was killed"
NEW=$(pgrep -P "$SP" -f llmserve-worker) || fail "worker not restarted"
[ "$NEW" != "$WPID" ] || fail "same worker pid"
CHILDREN=$(pgrep -P "$SP" | tr '\n' ' ')
kill -TERM "$SP"
wait "$SP" || fail "serve exited with an error"
for p in $CHILDREN; do kill -0 "$p" 2>/dev/null && fail "child $p still running after SIGTERM"; done
echo "serve e2e: answered, restarted a killed worker (pid $WPID -> $NEW), stopped cleanly"
