#!/usr/bin/env bash
# Multi-LoRA: tests/ref/lora_ref.py makes a tiny random-weight Llama (GGUF,
# and the same as a Hugging Face directory), two PEFT adapters and the same
# adapters merged into the weights offline; a worker serves the GGUF with
# both adapters (--enable-lora --lora-modules), another the Hugging Face
# base with them, a third the GGUF over 2 tensor-parallel ranks with them,
# others the merged models, each behind a gateway, and
# lora_check.py holds every adapter's answers to the merged model's, alone
# and batched with the other adapter and the base model. Adapters the engine
# cannot apply are refused by name. lora_runtime.py loads and unloads adapters
# while two more groups serve (POST /v1/load_lora_adapter, /v1/unload_lora_adapter),
# one of them PP=2 x TP=2.
#   run_lora_e2e.sh BUILD_DIR MODEL
# Exit 77 (skipped) when the model or the packages cannot be had.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/ref_venv.sh"
ref_models "$1" "$2" lora
"$BUILD/tests/lora_test" "$OUT" || exit 1
B=$((21000 + $$ % 8000))
W=("$BUILD/llmserve-worker" --kv-cache-memory 64MiB --threads 1 --log-level warn)
LM=(--enable-lora --lora-modules "a=$OUT/lora-a" --lora-modules "b=$OUT/lora-b")
GL=(--lora-modules "ga=$OUT/lora-a.gguf,gb=$OUT/lora-b.gguf") # GGUF LoRA files beside them
i=0
for spec in "base.gguf|${LM[*]} ${GL[*]}" "merged-a|" "merged-b|" "base-hf|${LM[*]} ${GL[*]}" \
    "base.gguf|${LM[*]} ${GL[*]} --tensor-parallel-size 2"; do
    m=${spec%%|*} extra=${spec#*|}
    # shellcheck disable=SC2086
    "${W[@]}" --model "$OUT/$m" $extra --served-model-name base --listen tcp://127.0.0.1:$((B + i)) >"$OUT/w$i.log" 2>&1 &
    PIDS+=($!)
    "$BUILD/llmserve-gateway" --port $((B + 10 + i)) --workers tcp://127.0.0.1:$((B + i)) --log-level warn \
        >"$OUT/g$i.log" 2>&1 & PIDS+=($!)
    i=$((i + 1))
done
for k in 0 1 2 3 4; do
    for _ in $(seq 1 150); do
        curl -s "http://127.0.0.1:$((B + 10 + k))/health" 2>/dev/null | grep -q '"workers_up":1' && break
        sleep 0.2
    done
done
U=http://127.0.0.1
"$VENV/bin/python" "$HERE/lora_check.py" $U:$((B + 10)) $U:$((B + 11)) $U:$((B + 12)) base $U:$((B + 13)) $U:$((B + 14)) ||
    { tail -5 "$OUT"/*.log; exit 1; }
# adapters loaded and unloaded at run time: two groups (one of two pipeline stages of 2 TP ranks each, where
# an update goes down the pipe to every stage and all four ranks agree) with --enable-lora and none at start,
# behind one gateway; a second gateway fronts the staged group alone
RT=(--enable-lora --max-loras 2 --served-model-name base)
"${W[@]}" --model "$OUT/base.gguf" "${RT[@]}" --listen tcp://127.0.0.1:$((B + 5)) >"$OUT/w5.log" 2>&1 & PIDS+=($!)
"${W[@]}" --model "$OUT/base.gguf" "${RT[@]}" --tensor-parallel-size 2 --pipeline-parallel-size 2 \
    --listen tcp://127.0.0.1:$((B + 6)) \
    >"$OUT/w6.log" 2>&1 & PIDS+=($!)
"$BUILD/llmserve-gateway" --port $((B + 15)) --workers tcp://127.0.0.1:$((B + 5)),tcp://127.0.0.1:$((B + 6)) \
    --log-level warn >"$OUT/g5.log" 2>&1 & PIDS+=($!)
"$BUILD/llmserve-gateway" --port $((B + 16)) --workers tcp://127.0.0.1:$((B + 6)) --log-level warn >"$OUT/g6.log" 2>&1 &
PIDS+=($!)
for k in 5:2 6:1; do
    for _ in $(seq 1 150); do
        curl -s "http://127.0.0.1:$((B + 10 + ${k%:*}))/health" 2>/dev/null | grep -q "\"workers_up\":${k#*:}" && break
        sleep 0.2
    done
done
"$VENV/bin/python" "$HERE/lora_runtime.py" $U:$((B + 15)) $U:$((B + 16)) $U:$((B + 11)) $U:$((B + 12)) "$OUT" base ||
    { tail -5 "$OUT"/w5.log "$OUT"/w6.log "$OUT"/g5.log; exit 1; }
# refused by name: the worker exits saying which setting it cannot apply
fail=0
while IFS=$'\t' read -r dir want; do
    out=$(timeout 60 "${W[@]}" --model "$OUT/base.gguf" --enable-lora --lora-modules "bad=$dir" \
          --listen tcp://127.0.0.1:$((B + 9)) 2>&1); rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && echo "$out" | grep -q -- "$want"; then
        echo "ok   $(basename "$dir") refused, naming $want"
    else
        echo "FAIL $(basename "$dir"): exit $rc, no '$want' in: $out"; fail=1
    fi
done < <("$VENV/bin/python" -c 'import json,sys; [print("%s\t%s" % kv) for kv in json.load(open(sys.argv[1])).items()]' "$OUT/bad.json")
out=$(timeout 60 "${W[@]}" --model "$OUT/base.gguf" --lora-modules "a=$OUT/lora-a" --listen tcp://127.0.0.1:$((B + 9)) 2>&1)
echo "$out" | grep -q -- "--enable-lora" && echo "ok   --lora-modules without --enable-lora refused" ||
    { echo "FAIL: --lora-modules without --enable-lora: $out"; fail=1; }
[ $fail = 0 ] || exit 1
echo "lora e2e: 0 failed"
