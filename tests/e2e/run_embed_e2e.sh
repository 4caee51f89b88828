#!/usr/bin/env bash
# /v1/embeddings end to end: `llmserve serve` with the chat model and
# --embedding-model (two worker groups behind one gateway), driven by the
# `openai` client and plain HTTP (test_embeddings.py), checked against the
# independent reference in tests/data/minilm_golden.json; langchain-openai's
# OpenAIEmbeddings too when it can be installed; /v1/score and /v1/rerank
# (test_score.py, the cohere SDK when it installs). Then the same with
# --semantic-cache (test_semcache.py).
#   run_embed_e2e.sh BUILD_DIR CHAT_MODEL EMBED_MODEL_DIR
# Exit 77 (skipped) when a model or the packages cannot be had.
set -uo pipefail
BUILD=$1
MODEL=$2
EMB=$3
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f "$MODEL" ] || { echo "model $MODEL not found: run tools/setup.sh"; exit 77; }
[ -f "$EMB/config.json" ] || { echo "embedding model $EMB not found: run tools/setup.sh"; exit 77; }
VENV="$BUILD/.venv-e2e"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import openai" 2>/dev/null; then
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >/dev/null 2>&1 || { echo "python3 venv unavailable"; exit 77; }
    "$VENV/bin/pip" install -q openai jsonschema >/dev/null 2>&1 || { echo "pip install openai failed (offline?)"; exit 77; }
fi
PORT=$((20000 + $$ % 12000))  # below the ephemeral range (32768+)
"$BUILD/llmserve" serve "$MODEL" --embedding-model "$EMB" --port "$PORT" --threads 1 --kv-cache-memory 256MiB \
    --max-model-len 1024 --log-level warn &
SERVE=$!
trap 'kill $SERVE 2>/dev/null; wait $SERVE 2>/dev/null' EXIT
ok=0
for _ in $(seq 1 300); do
    n=$(curl -sf "http://127.0.0.1:$PORT/v1/models" 2>/dev/null | grep -o '"object":"model"' | wc -l)
    if [ "$n" = 2 ]; then ok=1; break; fi  # both groups: the chat model and the embedding model
    sleep 0.2
done
[ $ok = 1 ] || { echo "the two worker groups never came up"; exit 1; }
export GW=http://127.0.0.1:$PORT GOLDEN="$HERE/../data/minilm_golden.json"
rc=0
"$VENV/bin/python" "$HERE/test_embeddings.py" || rc=1
# /v1/score and /v1/rerank over the same groups (the cohere SDK too, when it installs)
"$VENV/bin/python" -c "import cohere" 2>/dev/null || "$VENV/bin/pip" install -q cohere >/dev/null 2>&1 ||
    echo "note: pip install cohere failed (offline?): its rerank call is skipped"
"$VENV/bin/python" "$HERE/test_score.py" || rc=1
if "$VENV/bin/python" -c "import langchain_openai" 2>/dev/null || "$VENV/bin/pip" install -q langchain-openai >/dev/null 2>&1; then
    LANGCHAIN=1 "$VENV/bin/python" "$HERE/test_embeddings.py" langchain || rc=1
else
    echo "skip langchain: pip install langchain-openai failed (offline?)"
fi
kill $SERVE 2>/dev/null
wait $SERVE 2>/dev/null
# the same pair of groups with --semantic-cache: two API keys, a 4 s TTL, room for 6 answers
PORT=$((PORT + 1))
"$BUILD/llmserve" serve "$MODEL" --embedding-model "$EMB" --port "$PORT" --threads 1 --kv-cache-memory 256MiB \
    --max-model-len 1024 --log-level warn --semantic-cache --semantic-cache-ttl 4 --semantic-cache-size 6 \
    --api-key key-one --api-key key-two &
SERVE=$!
ok=0
for _ in $(seq 1 300); do
    n=$(curl -sf -H "Authorization: Bearer key-one" "http://127.0.0.1:$PORT/v1/models" 2>/dev/null | grep -o '"object":"model"' | wc -l)
    if [ "$n" = 2 ]; then ok=1; break; fi
    sleep 0.2
done
[ $ok = 1 ] || { echo "the cached server never came up"; exit 1; }
GW=http://127.0.0.1:$PORT "$VENV/bin/python" "$HERE/test_semcache.py" || rc=1
exit $rc
