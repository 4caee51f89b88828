#!/usr/bin/env bash
# GPU checks, one prepared script for a machine with an NVIDIA GPU (about 3
# minutes on an H200, most of it the build):
#   (a) every CUDA kernel against its CPU reference (tests/unit/cuda_test.c:
#       norm, RoPE, GGUF matmul, cuBLAS BF16/F16 GEMM, dequantization,
#       embedding, K/V stores into a NaN-poisoned paged pool through shuffled
#       block tables, paged attention with and without split-K, sampling);
#       the NCCL comm backend on a one-rank communicator;
#   (b) end to end (tests/unit/cuda_model_test.c): the CUDA forward pass
#       against the CPU's on generated random models (F32, Q8_0, Q4_0, a
#       qwen2 shape) and on stories260K (STORIES_DIR, default
#       ../shared/models/stories260K, carry it along), greedy tokens
#       identical; the batching engine on the GPU against the CPU engine;
#   (c) benchmarks: llmserve-cuda-kernel-bench (a llama-3-8b decode step's
#       cuBLAS GEMMs against the HBM bound, paged attention), then the engine
#       on dummy llama-3-8b BF16 (single stream; 64 and 256 concurrent,
#       1024 in / 128 out), llama-3-8b and llama-3-70b with --quantization
#       fp8 (the 70B on one GPU); then the whole stack (llmserve serve on
#       dummy llama-3-8b) swept with llmserve bench serve.
#   (d) pipeline stages on the GPU (tests/gpu/pp_gpu.py): two stages sharing
#       the GPU, their hops staged through the host, against one rank.
# Not built yet: AWQ/GPTQ INT4 checkpoints, CUDA graphs, FP8 KV cache, a
# stage of several GPUs (its own NCCL communicator). The tensor-parallel
# CUDA forward needs two GPUs to check. Without a GPU it
# says so and exits 0.
#   tests/gpu/run.sh [BUILD_DIR]      (default build-gpu)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "tests/gpu/run.sh: no NVIDIA GPU here; skipped"
    exit 0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
HBM=${HBM_TBPS:-4.8}   # H200; H100 SXM: 3.35
cmake -S "$ROOT" -B "$BUILD" -DLLMSERVE_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" \
    >/dev/null || exit 1
STORIES=${STORIES_DIR:-$ROOT/../shared/models/stories260K}
cmake --build "$BUILD" -j "$(nproc)" --target cuda_test cuda_plan_test cuda_model_test kernels_test nccl_test \
    llmserve-cuda-kernel-bench llmserve-engine-bench \
    2>&1 | grep -E "error|warning" ; true
fail=0
for t in cuda_test cuda_plan_test cuda_model_test nccl_test kernels_test; do
    [ -x "$BUILD/tests/$t" ] || { echo "== $t: not built"; fail=1; continue; }
    echo "== $t"
    arg=""
    [ $t = cuda_model_test ] && arg=$STORIES
    timeout 300 "$BUILD/tests/$t" $arg 2>&1 | grep -v "^ok" | tail -40
    rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || { echo "== $t FAILED (exit $rc)"; fail=1; }
done
echo "== kernel bench (llama-3-8b shape, BF16, HBM bound $HBM TB/s)"
timeout 240 "$BUILD/llmserve-cuda-kernel-bench" --preset llama-3-8b --batches 1,64,256 --ctx 1152 --hbm-tbps "$HBM" \
    || { echo "== kernel bench FAILED"; fail=1; }
EB="$BUILD/llmserve-engine-bench --device cuda --load-format dummy --max-model-len 2048 --max-num-seqs 256"
echo "== engine, dummy llama-3-8b BF16: single stream (HBM bound: 16.06 GB / $HBM TB/s)"
timeout 150 $EB --model-config llama-3-8b --dtype bf16 --concurrency 1 --prompt-len 1024 --gen 128 --repeats 2 \
    --max-num-batched-tokens 2048 --system-len 1000 || { echo "== engine 8B single FAILED"; fail=1; }
echo "== engine, dummy llama-3-8b BF16: 64 and 256 concurrent, 1024 in / 128 out"
timeout 200 $EB --model-config llama-3-8b --dtype bf16 --concurrency 64,256 --prompt-len 1024 --gen 128 --repeats 1 \
    --max-num-batched-tokens 8192 --system-len 1000 || { echo "== engine 8B concurrent FAILED"; fail=1; }
echo "== engine, dummy llama-3-8b --quantization fp8: single stream and 64 concurrent"
timeout 120 $EB --model-config llama-3-8b --dtype bf16 --quantization fp8 --concurrency 1,64 --prompt-len 1024 --gen 128 \
    --repeats 1 --max-num-batched-tokens 8192 --system-len 1000 || { echo "== engine 8B fp8 FAILED"; fail=1; }
echo "== engine, dummy llama-3-70b --quantization fp8 on one GPU (about 74 GB of weights)"
timeout 150 $EB --model-config llama-3-70b --dtype bf16 --quantization fp8 --concurrency 1,64 --prompt-len 1024 --gen 64 \
    --repeats 1 --max-num-batched-tokens 4096 --system-len 1000 || { echo "== engine 70B fp8 FAILED"; fail=1; }
echo "== engine, dummy llama-3-8b BF16 drafted by a dummy 1B of its tokenizer's size (llama-3.2-1b shape), K=4"
echo "   (random weights: drafts are rarely taken; this times the draft's steps and runs the CUDA path, cost rule off)"
D1B=$(mktemp -d)
printf '{"num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": true, "rope_theta": 500000, "max_position_embeddings": 8192}' >"$D1B/config.json"
timeout 150 $EB --model-config llama-3-8b --dtype bf16 --concurrency 1,64 --prompt-len 1024 --gen 64 --repeats 1 \
    --max-num-batched-tokens 8192 --system-len 1000 \
    --speculative-config "{\"method\": \"draft_model\", \"model\": \"$D1B/config.json\", \"num_speculative_tokens\": 4, \"cost_rule\": false}" \
    || { echo "== engine 8B + 1B draft FAILED"; fail=1; }
rm -rf "$D1B"
echo "== pipeline stages on the GPU: PP=2 (two processes on this GPU, host-staged hops) vs one rank, dummy head_dim 128"
cmake --build "$BUILD" -j "$(nproc)" --target llmserve-worker llmserve-gateway 2>&1 | grep -E "error" ; true
timeout 150 python3 "$ROOT/tests/gpu/pp_gpu.py" "$BUILD" --device cuda 2>&1 | grep -v "^20" | tail -12
[ "${PIPESTATUS[0]}" = 0 ] || { echo "== pipeline stages FAILED"; fail=1; }
echo "== serving: llmserve serve on dummy llama-3-8b BF16, bench serve --sweep max-concurrency=1,8,24 (1024 in / 128 out)"
cmake --build "$BUILD" -j "$(nproc)" --target llmserve llmserve-worker llmserve-gateway 2>&1 | grep -E "error" ; true
PORT=18123
"$BUILD/llmserve" serve --device cuda --load-format dummy --model-config llama-3-8b --dtype bf16 --port $PORT \
    --max-model-len 2048 --max-num-batched-tokens 8192 --log-level warn >"$BUILD/serve-gpu.log" 2>&1 &
SP=$!
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break; sleep 0.2; done
timeout 150 "$BUILD/llmserve" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts 24 --random-input-len 1024 \
    --random-output-len 128 --ignore-eos --sweep max-concurrency=1,8,24 --result-dir "$BUILD/sweep-gpu" 2>/dev/null \
    | sed -n '/==== Sweep/,$p' || { echo "== serving sweep FAILED"; fail=1; }
kill $SP 2>/dev/null
wait $SP 2>/dev/null
exit $fail
