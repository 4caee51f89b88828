#!/usr/bin/env bash
# Architectures beyond plain Llama, against an independent reference:
# tests/ref/arch_ref.py makes tiny random-weight Qwen3, Qwen3-MoE, Mixtral
# and gpt-oss models (GGUF, merged and per-expert expert tensors, and Hugging
# Face directories) with reference logits from the numpy forward, and models
# carrying settings the engine does not implement; rope_test holds our
# logits to the reference (1e-3 relative, top-1 equal) and checks each
# refusal names its setting. Then the Qwen3-MoE GGUF and the Mixtral and
# gpt-oss directories are served: a worker and a gateway each (a gateway serves one
# generative model), a completion and a streamed chat from each.
#   run_arch_e2e.sh BUILD_DIR MODEL
# Exit 77 (skipped) when the model or the packages cannot be had.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/ref_venv.sh"
ref_models "$1" "$2" arch
"$BUILD/tests/rope_test" "$OUT" || exit 1
# llmserve quantize on experts: the router keeps F32 (as llama.cpp keeps it), the merged ffn_down_exps gets
# the _M mix's higher type (Q6_K, here its Q8_0 fallback: 32-wide rows), and the result loads and generates
"$BUILD/llmserve" quantize "$OUT/qwen3moe.gguf" "$OUT/q4km.gguf" --type Q4_K_M >"$OUT/q.log" 2>&1 ||
    { echo "FAIL: quantize qwen3moe"; cat "$OUT/q.log"; exit 1; }
TY=$("$VENV/bin/python" -c '
import sys; from gguf import GGUFReader
t = {x.name: x.tensor_type.name for x in GGUFReader(sys.argv[1]).tensors}
print(t["blk.0.ffn_gate_inp.weight"], t["blk.0.ffn_down_exps.weight"], t["blk.0.ffn_gate_exps.weight"])' "$OUT/q4km.gguf")
[ "$TY" = "F32 Q8_0 Q5_0" ] || { echo "FAIL: Q4_K_M of experts: router, down, gate types are $TY"; exit 1; }
G=$("$BUILD/llmserve" generate --model "$OUT/q4km.gguf" --prompt "Hello" -n 4 --threads 1 2>&1) ||
    { echo "FAIL: the quantized qwen3moe does not generate: $G"; exit 1; }
echo "ok   quantize Q4_K_M on experts: router F32, ffn_down_exps Q8_0, ffn_gate_exps Q5_0; it generates"
W1=$((21000 + $$ % 9000)); W2=$((W1 + 1)); G1=$((W1 + 2)); G2=$((W1 + 3)); W3=$((W1 + 5)); G3=$((W1 + 6))
"$BUILD/llmserve-worker" --model "$OUT/qwen3moe.gguf" --kv-cache-memory 64MiB --threads 1 --log-level warn \
    --listen tcp://127.0.0.1:$W1 >"$OUT/w1.log" 2>&1 & PIDS+=($!)
"$BUILD/llmserve-worker" --model "$OUT/hf-mixtral" --kv-cache-memory 64MiB --threads 1 --log-level warn \
    --listen tcp://127.0.0.1:$W2 >"$OUT/w2.log" 2>&1 & PIDS+=($!)
"$BUILD/llmserve-gateway" --port $G1 --workers tcp://127.0.0.1:$W1 --log-level warn >"$OUT/g1.log" 2>&1 & PIDS+=($!)
"$BUILD/llmserve-gateway" --port $G2 --workers tcp://127.0.0.1:$W2 --log-level warn >"$OUT/g2.log" 2>&1 & PIDS+=($!)
# gpt-oss from its Hugging Face directory (MXFP4 experts as OpenAI ships them)
"$BUILD/llmserve-worker" --model "$OUT/hf-gpt-oss" --kv-cache-memory 64MiB --threads 1 --log-level warn \
    --listen tcp://127.0.0.1:$W3 >"$OUT/w3.log" 2>&1 & PIDS+=($!)
"$BUILD/llmserve-gateway" --port $G3 --workers tcp://127.0.0.1:$W3 --log-level warn >"$OUT/g3.log" 2>&1 & PIDS+=($!)
for gw in "qwen3moe $G1" "hf-mixtral $G2" "hf-gpt-oss $G3"; do
    set -- $gw
    name=$1 GP=$2
    for _ in $(seq 1 150); do
        curl -s "http://127.0.0.1:$GP/health" 2>/dev/null | grep -q '"workers_up":1' && break
        sleep 0.2
    done
    MODELS=$(curl -s "http://127.0.0.1:$GP/v1/models")
    echo "$MODELS" | grep -q "\"id\":\"$name\"" || { echo "FAIL: /v1/models does not list $name: $MODELS"; cat "$OUT"/*.log; exit 1; }
    R=$(curl -s -m 60 "http://127.0.0.1:$GP/v1/completions" -H 'Content-Type: application/json' \
        -d "{\"model\": \"$name\", \"prompt\": \"The experts of a mixture\", \"max_tokens\": 6, \"temperature\": 0, \"ignore_eos\": true}")
    echo "$R" | grep -q '"completion_tokens":6' || { echo "FAIL: $name completion: $R"; cat "$OUT"/*.log; exit 1; }
    S=$(curl -sN -m 60 "http://127.0.0.1:$GP/v1/chat/completions" -H 'Content-Type: application/json' \
        -d "{\"model\": \"$name\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}], \"max_tokens\": 5, \"stream\": true, \"ignore_eos\": true}")
    echo "$S" | grep -q 'data: \[DONE\]' && [ "$(echo "$S" | grep -c '"content"')" -ge 1 ] ||
        { echo "FAIL: $name streamed chat: $S"; cat "$OUT"/*.log; exit 1; }
    echo "ok   $name served through a gateway: a completion of 6 tokens and a streamed chat"
done
# gpt-oss's harmony format: its vocabulary's markers pick the template; a reply held to harmony's shape by a
# regex comes back split, the analysis channel as reasoning_content and the final one as content, streamed or not
RX='<\\|channel\\|>analysis<\\|message\\|>[a-z]{2,6} [a-z]{2,6}<\\|end\\|><\\|start\\|>assistant<\\|channel\\|>final<\\|message\\|>[a-z]{2,6} [a-z]{2,6}'
HB="{\"model\": \"hf-gpt-oss\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 46, \"temperature\": 0, \"guided_regex\": \"$RX\""
H1=$(curl -s -m 60 "http://127.0.0.1:$G3/v1/chat/completions" -H 'Content-Type: application/json' -d "$HB}" | "$VENV/bin/python" -c '
import json, sys; m = json.load(sys.stdin)["choices"][0]["message"]; print(json.dumps([m.get("reasoning_content"), m["content"]]))')
H2=$(curl -sN -m 60 "http://127.0.0.1:$G3/v1/chat/completions" -H 'Content-Type: application/json' -d "$HB, \"stream\": true}" | "$VENV/bin/python" -c '
import json, sys
r = c = ""
for l in sys.stdin:
    if l.startswith("data: {"):
        d = json.loads(l[6:])["choices"][0]["delta"]
        r += d.get("reasoning_content") or ""
        c += d.get("content") or ""
print(json.dumps([r, c]))')
echo "$H1" | "$VENV/bin/python" -c '
import json, re, sys; r, c = json.loads(sys.stdin.read())
sys.exit(0 if r and c and re.fullmatch("[a-z]+ [a-z]+", r) and re.fullmatch("[a-z]+ [a-z]+", c) else 1)' && [ "$H1" = "$H2" ] ||
    { echo "FAIL: harmony reply split: $H1, streamed $H2"; cat "$OUT/w3.log" "$OUT/g3.log"; exit 1; }
echo "ok   gpt-oss harmony: reasoning_content and content split, the same streamed: $H1"
# the same through the Responses API: a reasoning item (its text the analysis channel) and a message item, and
# streamed, the reasoning as response.reasoning_text.delta events
RB="{\"model\": \"hf-gpt-oss\", \"input\": \"Hi\", \"max_output_tokens\": 46, \"temperature\": 0, \"structured_outputs\": {\"regex\": \"$RX\"}"
R1=$(curl -s -m 60 "http://127.0.0.1:$G3/v1/responses" -H 'Content-Type: application/json' -d "$RB}" | "$VENV/bin/python" -c '
import json, sys; o = json.load(sys.stdin)["output"]
print(json.dumps([o[0]["type"], o[0]["content"][0]["text"], o[1]["type"], o[1]["content"][0]["text"]]))')
R2=$(curl -sN -m 60 "http://127.0.0.1:$G3/v1/responses" -H 'Content-Type: application/json' -d "$RB, \"stream\": true}" | "$VENV/bin/python" -c '
import json, sys
r = c = ""
for l in sys.stdin:
    if l.startswith("data: {"):
        d = json.loads(l[6:])
        r += d["delta"] if d["type"] == "response.reasoning_text.delta" else ""
        c += d["delta"] if d["type"] == "response.output_text.delta" else ""
print(json.dumps(["reasoning", r, "message", c]))')
[ "$R1" = "$R2" ] && [ "$R1" = "$(echo "$H1" | "$VENV/bin/python" -c 'import json, sys; r, c = json.load(sys.stdin); print(json.dumps(["reasoning", r, "message", c]))')" ] ||
    { echo "FAIL: harmony through /v1/responses: $R1, streamed $R2 (chat: $H1)"; cat "$OUT/g3.log"; exit 1; }
echo "ok   gpt-oss harmony through /v1/responses: a reasoning item and a message, the same streamed: $R1"
# expert parallelism through llmserve serve: 2 ranks, 4 experts each, the same greedy text as one rank
SP=$((W1 + 4))
"$BUILD/llmserve" serve "$OUT/qwen3moe.gguf" --port $SP --tensor-parallel-size 2 --enable-expert-parallel --threads 1 \
    --kv-cache-memory 64MiB --log-level warn >"$OUT/s.log" 2>&1 & PIDS+=($!)
for _ in $(seq 1 150); do curl -sf "http://127.0.0.1:$SP/health" >/dev/null 2>&1 && break; sleep 0.2; done
# (the text, and each position's 3 likeliest tokens with their log-probabilities to 2 decimals)
BODY='{"prompt": "The experts of a mixture", "max_tokens": 12, "temperature": 0, "ignore_eos": true, "logprobs": 3}'
SUM='import json,sys; c = json.load(sys.stdin)["choices"][0]
print(json.dumps([c["text"], [sorted((k, round(v, 2)) for k, v in t.items()) for t in c["logprobs"]["top_logprobs"]]]))'
A=$(curl -s -m 60 "http://127.0.0.1:$G1/v1/completions" -H 'Content-Type: application/json' -d "$BODY" | "$VENV/bin/python" -c "$SUM")
B=$(curl -s -m 60 "http://127.0.0.1:$SP/v1/completions" -H 'Content-Type: application/json' -d "$BODY" | "$VENV/bin/python" -c "$SUM")
[ -n "$A" ] && [ "$A" = "$B" ] || { echo "FAIL: expert parallel over 2 ranks answered $B, one rank $A"; cat "$OUT/s.log"; exit 1; }
echo "ok   serve --tensor-parallel-size 2 --enable-expert-parallel: the same 12 greedy tokens and top-3 log-probabilities as one rank"
echo "arch e2e: 0 failed"
