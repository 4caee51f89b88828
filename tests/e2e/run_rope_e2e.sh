#!/usr/bin/env bash
# RoPE scaling and refused model settings: tests/ref/rope_ref.py makes tiny
# random-weight Llama models (GGUF with rope_freqs.weight, linear and yarn
# keys; Hugging Face directories with llama3, linear, dynamic and yarn
# rope_scaling) with reference logits from the independent numpy forward,
# and models carrying settings the engine does not implement; rope_test
# holds our logits to the reference past the original context and checks
# each refusal names its key. Then a worker refuses a --max-model-len past
# the context yarn allows, and a worker whose model has no scaling, given
# yarn by --rope-scaling, answers a prompt past its original context through
# a gateway.
#   run_rope_e2e.sh BUILD_DIR MODEL
# Exit 77 (skipped) when the model or the packages cannot be had.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/ref_venv.sh"
ref_models "$1" "$2" rope
"$BUILD/tests/rope_test" "$OUT" || exit 1
# the context the scaling allows: yarn 4x over 128 -> 512, as vLLM derives it
W=("$BUILD/llmserve-worker" --model "$OUT/hf-yarn" --kv-cache-memory 64MiB --threads 1 --log-level warn)
"${W[@]}" --listen tcp://127.0.0.1:$((21000 + $$ % 9000)) --max-model-len 513 >"$OUT/w513.log" 2>&1
rc=$?
grep -q "513" "$OUT/w513.log" && [ $rc -ne 0 ] ||
    { echo "FAIL: --max-model-len 513 past yarn's 512 was not refused (exit $rc)"; cat "$OUT/w513.log"; exit 1; }
echo "ok   --max-model-len 513 past what yarn 4x over 128 allows is refused: $(grep -m1 513 "$OUT/w513.log")"
WP=$((21000 + $$ % 9000)); GP=$((WP + 1))
# served: a model without scaling given yarn by --rope-scaling, as vLLM's flag does, to the context it allows
"$BUILD/llmserve-worker" --model "$OUT/short.gguf" --kv-cache-memory 64MiB --threads 1 --log-level warn \
    --rope-scaling '{"rope_type":"yarn","factor":4,"original_max_position_embeddings":128}' \
    --listen tcp://127.0.0.1:$WP --max-model-len 512 >"$OUT/w.log" 2>&1 & PIDS+=($!)
"$BUILD/llmserve-gateway" --port $GP --workers tcp://127.0.0.1:$WP --log-level warn >"$OUT/g.log" 2>&1 & PIDS+=($!)
for _ in $(seq 1 150); do
    curl -s "http://127.0.0.1:$GP/health" 2>/dev/null | grep -q '"workers_up":1' && break
    sleep 0.2
done
R=$(curl -s -m 60 "http://127.0.0.1:$GP/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"$(printf 'word %.0s' $(seq 1 200))\", \"max_tokens\": 4, \"temperature\": 0}")
echo "$R" | grep -q '"completion_tokens":4' ||
    { echo "FAIL: the --rope-scaling yarn model did not answer a 400-token completion through the gateway: $R"; cat "$OUT/w.log"; exit 1; }
echo "ok   a 128-token model given yarn 4x by --rope-scaling serves a 400-token prompt through the gateway"
echo "rope e2e: 0 failed"
