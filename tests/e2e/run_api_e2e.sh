#!/usr/bin/env bash
# The OpenAI API as clients use it, end to end: a real worker and gateway on
# loopback, the `openai` client, `jsonschema` as the reference validator
# (both in the e2e venv in the build folder), and `llmserve perplexity` as
# the reference for prompt scoring. Runs test_structured.py,
# test_scoring.py, test_tools.py, test_trimming.py, test_reasoning.py (a
# second gateway with --reasoning-parser qwen3), test_anthropic.py (the
# `anthropic` SDK against a third, with an API key), test_responses.py (the
# Responses API through the `openai` SDK, against the third with two keys;
# test_responses_cluster.py: two gateways sharing Redis, two groups, haproxy),
# test_agents.py (the OpenAI Agents SDK on the Responses API), test_batches.py
# (files and batch jobs: two gateways, cancel, a gateway killed mid-batch), test_langchain.py (langchain-openai) and test_lmeval.py
# (lm-evaluation-harness) against the same gateway; the last two skip, saying
# so, when their packages cannot be installed.
#   run_api_e2e.sh BUILD_DIR MODEL [quick]
# Exit 77 (skipped) when the model or the packages cannot be had.
set -uo pipefail
BUILD=$1
MODEL=$2
QUICK=${3:-} # quick (the sanitizer build): the server-side tests only, not the LangChain / lm-eval clients
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f "$MODEL" ] || { echo "model $MODEL not found: run tools/setup.sh"; exit 77; }
VENV="$BUILD/.venv-e2e"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import openai, jsonschema" 2>/dev/null; then
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >/dev/null 2>&1 || { echo "python3 venv unavailable"; exit 77; }
    "$VENV/bin/pip" install -q openai jsonschema >/dev/null 2>&1 || { echo "pip install openai jsonschema failed (offline?)"; exit 77; }
fi
BASE=$((20000 + $$ % 12000))  # below the ephemeral range (32768+)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
"$BUILD/llmserve-worker" --model "$MODEL" --kv-cache-memory 512MiB --max-model-len 2048 --log-level warn \
    --listen tcp://127.0.0.1:$BASE & PIDS+=($!)
"$BUILD/llmserve-gateway" --port $((BASE + 1)) --workers tcp://127.0.0.1:$BASE --log-level warn & PIDS+=($!)
"$BUILD/llmserve-gateway" --port $((BASE + 2)) --workers tcp://127.0.0.1:$BASE --reasoning-parser qwen3 --log-level warn \
    & PIDS+=($!)
"$BUILD/llmserve-gateway" --port $((BASE + 3)) --workers tcp://127.0.0.1:$BASE --api-key k-anth --api-key k-two --log-level warn & PIDS+=($!)
for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$((BASE + 1))/health" >/dev/null 2>&1 && curl -sf "http://127.0.0.1:$((BASE + 2))/health" \
        >/dev/null 2>&1 && break
    sleep 0.2
done
rc=0
export GW=http://127.0.0.1:$((BASE + 1))
T0=$SECONDS
took() { echo "api_e2e: $1 done at $((SECONDS - T0)) s"; }
"$VENV/bin/python" "$HERE/test_structured.py" || rc=1
took structured
LLMSERVE="$BUILD/llmserve" MODEL="$MODEL" "$VENV/bin/python" "$HERE/test_scoring.py" || rc=1
took scoring
"$VENV/bin/python" "$HERE/test_tools.py" || rc=1
took tools
"$VENV/bin/python" "$HERE/test_trimming.py" || rc=1
took trimming
GW=http://127.0.0.1:$((BASE + 2)) "$VENV/bin/python" "$HERE/test_reasoning.py" || rc=1
took reasoning
if "$VENV/bin/python" -c "import anthropic" 2>/dev/null || "$VENV/bin/pip" install -q anthropic >/dev/null 2>&1; then
    GW=http://127.0.0.1:$((BASE + 3)) KEY=k-anth "$VENV/bin/python" "$HERE/test_anthropic.py" || rc=1
    took anthropic
else
    echo "skip anthropic: pip install anthropic failed (offline?)"
fi
GW=http://127.0.0.1:$((BASE + 3)) KEY=k-anth KEY2=k-two "$VENV/bin/python" "$HERE/test_responses.py" || rc=1
took responses
# the same across a cluster: two gateways sharing a real Redis, two groups, haproxy (skips without redis-server),
# and every other endpoint through it (score and rerank with the embedding group of $LLMSERVE_EMBED_MODEL)
"$VENV/bin/python" "$HERE/test_responses_cluster.py" "$BUILD" "$MODEL"
case $? in 0) ;; 77) echo "skip responses cluster: redis-server not installed" ;; *) rc=1 ;; esac
took responses-cluster
# files and batch jobs: two gateways sharing a files directory; cancel; a gateway killed mid-batch
"$VENV/bin/python" "$HERE/test_batches.py" "$BUILD" "$MODEL" || rc=1
took batches
# a parser we do not have is refused at the start, by name
RP=$("$BUILD/llmserve-gateway" --port 0 --reasoning-parser granite 2>&1)
if echo "$RP" | grep -q "reasoning-parser expects"; then
    echo "ok   --reasoning-parser granite refused by name"
else
    echo "FAIL --reasoning-parser granite not refused"; rc=1
fi
if [ -n "$QUICK" ]; then
    echo "quick: the LangChain and lm-eval clients are left to the plain build (they add no server path)"
elif "$VENV/bin/python" -c "import langchain_openai" 2>/dev/null || "$VENV/bin/pip" install -q langchain-openai >/dev/null 2>&1; then
    "$VENV/bin/python" "$HERE/test_langchain.py" || rc=1
    took langchain
else
    echo "skip langchain: pip install langchain-openai failed (offline?)"
fi
if [ -n "$QUICK" ]; then
    :
elif "$VENV/bin/python" -c "import agents" 2>/dev/null || "$VENV/bin/pip" install -q openai-agents >/dev/null 2>&1; then
    MID=$(curl -s "http://127.0.0.1:$((BASE + 1))/v1/models" | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
    GW=http://127.0.0.1:$((BASE + 3)) KEY=k-anth MODEL_ID=$MID "$VENV/bin/python" "$HERE/test_agents.py" || rc=1
    took agents
else
    echo "skip agents: pip install openai-agents failed (offline?)"
fi
if [ -n "$QUICK" ]; then
    :
elif [ -x "$VENV/bin/lm_eval" ] || "$VENV/bin/pip" install -q "lm_eval[api]" >/dev/null 2>&1; then
    LMEVAL="$VENV/bin/lm_eval" "$VENV/bin/python" "$HERE/test_lmeval.py" || rc=1
    took lm-eval
else
    echo "skip lm-eval: pip install lm_eval[api] failed (offline?)"
fi
exit $rc
