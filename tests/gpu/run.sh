#!/usr/bin/env bash
# GPU checks in stages, each sized to finish in 4 minutes on an H100/H200 and
# print its own verdict ("== stage X: PASS in N s" or FAIL), so one device call
# can run a stage or two and a failed one can be rerun alone. Each stage
# resumes from the build the one before left (BUILD_DIR).
#   tests/gpu/run.sh STAGE [BUILD_DIR]     (default build-gpu; STAGE: build a b c d x all)
#   build  configure and build (no GPU needed: how the build is proven in a
#          clean room, tests/gpu/cleanroom.sh)
#   a      build, then every CUDA test under compute-sanitizer memcheck with
#          LLMSERVE_CUDA_SYNC=1 (a sync and a check after every kernel):
#          cuda_test (each kernel against its CPU reference: norm, RoPE, GGUF
#          matmul, cuBLAS GEMM, FP8, K/V stores into a NaN-poisoned paged pool,
#          paged attention at head_dim 64/128/256, GQA 1-8, blocks 16/32, a 32k
#          context, split and not, sampling with and without a grammar's mask),
#          cuda_model_test (the forward pass against the CPU's, teacher-forced
#          logits at head_dim 32/128/256; the engine against the CPU engine),
#          nccl_test (the NCCL comm on one rank; TP=2 where two GPUs are)
#   b      benchmarks against their bounds: llmserve-cuda-kernel-bench (the
#          llama-3-8b decode step's GEMMs and paged attention, each against its
#          HBM or FLOP bound; GGUF weights in Q4_0/Q8_0/Q4_K/Q6_K through
#          the fused GEMV and the tensor-core tiles at batches 1-256, beside
#          dequantize + cuBLAS), then the engine on dummy llama-3-8b BF16 (one
#          stream; the bound is 16.06 GB / HBM) and FP8 at 64 streams
#   c      optional: the whole stack (llmserve serve on dummy llama-3-8b)
#          swept with llmserve bench serve
#   d      pipeline stages on the GPU (tests/gpu/pp_gpu.py): two stages
#          sharing the GPU, their hops staged through the host, against one rank
#   x      optional: llama-3-70b FP8 on one GPU, and 8B drafted by a 1B
#   all    build a b d, one after another (a machine of your own)
# The machine needs only CUDA (nvcc, cuBLAS, NCCL or the nvidia-nccl wheel),
# CMake, a C compiler and Python: the libraries it lacks come from .devlibs/
# (tests/gpu/devlibs.sh writes it here; the device call carries it) and are
# unpacked into BUILD_DIR/sysroot. HBM_TBPS sets the bandwidth bound (H200 4.8,
# H100 SXM 3.35). LLMSERVE_DEVLIBS=1 takes .devlibs even where the machine has
# the libraries. Without a GPU every stage but build says so and exits 0.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STAGE=${1:-all}
BUILD=$(mkdir -p "${2:-$ROOT/build-gpu}" && cd "${2:-$ROOT/build-gpu}" && pwd)
HBM=${HBM_TBPS:-4.8}
T0=$SECONDS

verdict() { # stage, fail
    if [ "$2" = 0 ]; then echo "== stage $1: PASS in $((SECONDS - T0)) s"; else echo "== stage $1: FAIL in $((SECONDS - T0)) s"; fi
    return "$2"
}

have_gpu() { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }

# The libraries this machine lacks, from .devlibs/*.deb unpacked into BUILD/sysroot; all or none, so that
# pkg-config never mixes the machine's .pc files with the sysroot's.
use_devlibs() {
    local SR=$BUILD/sysroot have=1
    command -v protoc-c >/dev/null && command -v pkg-config >/dev/null &&
        pkg-config --exists libevent jansson libxxhash libprotobuf-c 2>/dev/null &&
        { [ -f /usr/lib/x86_64-linux-gnu/cmake/nng/nng-config.cmake ] || [ -f /usr/local/lib/cmake/nng/nng-config.cmake ]; } || have=0
    [ "${LLMSERVE_DEVLIBS:-0}" = 1 ] && have=0 # the sysroot even where the machine has its own (a test of it)
    [ $have = 1 ] && return 0
    ls "$ROOT"/.devlibs/*.deb >/dev/null 2>&1 || {
        echo "run.sh: this machine lacks NNG, protobuf-c, jansson, libevent or xxHash, and .devlibs/ is empty:"
        echo "        run tests/gpu/devlibs.sh where apt works and carry .devlibs"
        return 1
    }
    if [ ! -f "$SR/.unpacked" ]; then
        mkdir -p "$SR"
        for f in "$ROOT"/.devlibs/*.deb; do
            if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$f" "$SR" || return 1
            else python3 "$ROOT/tests/gpu/undeb.py" "$f" "$SR" || return 1; fi
        done
        touch "$SR/.unpacked"
    fi
    local LIB=$SR/usr/lib/x86_64-linux-gnu
    export PATH=$SR/usr/bin:$PATH LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PKG_CONFIG_LIBDIR=$LIB/pkgconfig:$SR/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$SR
    DEVLIBS_CMAKE="-Dnng_DIR=$LIB/cmake/nng"
    echo "run.sh: NNG, protobuf-c, jansson, libevent, xxHash from .devlibs (unpacked in $SR)"
}

# NCCL: the CUDA toolkit's, or the nvidia-nccl wheel's that PyTorch brings.
nccl_root() {
    for d in /usr/local/cuda /usr/local/cuda/targets/x86_64-linux /usr; do
        [ -f "$d/include/nccl.h" ] && return 0
    done
    python3 - <<'EOF' 2>/dev/null
import os
try:
    import nvidia.nccl as n
    d = list(n.__path__)[0]
    if os.path.isfile(os.path.join(d, "include", "nccl.h")):
        print(d)
except Exception:
    pass
EOF
}

build() {
    use_devlibs || return 1
    DEVLIBS_CMAKE=${DEVLIBS_CMAKE:-}
    local nr gen=""
    nr=$(nccl_root)
    command -v ninja >/dev/null && [ ! -f "$BUILD/CMakeCache.txt" ] && gen="-G Ninja"
    # shellcheck disable=SC2086
    cmake -S "$ROOT" -B "$BUILD" $gen -DLLMSERVE_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" ${nr:+-DNCCL_ROOT=$nr} $DEVLIBS_CMAKE >"$BUILD/configure.log" 2>&1 ||
        { tail -30 "$BUILD/configure.log"; return 1; }
    grep -E "llmserve: (CUDA|NCCL)" "$BUILD/configure.log"
    local nccl_t=nccl_test
    grep -q "NCCL not found" "$BUILD/configure.log" && nccl_t="" # stage a then says nccl_test was not built
    # shellcheck disable=SC2086
    cmake --build "$BUILD" -j "$(nproc)" --target cuda_test cuda_plan_test cuda_model_test $nccl_t \
        llmserve-cuda-kernel-bench llmserve-engine-bench llmserve llmserve-worker llmserve-gateway >"$BUILD/build.log" 2>&1 ||
        { grep -E "error|Error" "$BUILD/build.log" | head -30; return 1; }
    echo "run.sh: built in $((SECONDS - T0)) s"
}

# one test under memcheck (plain where compute-sanitizer is missing), its own time limit
sanitized() { # seconds test args...
    local lim=$1 t=$2
    shift 2
    [ -x "$BUILD/tests/$t" ] || { echo "== $t: not built (NCCL missing?)"; return 1; }
    local cs=""
    command -v compute-sanitizer >/dev/null && cs="compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20"
    echo "== $t${cs:+ (memcheck)}"
    # shellcheck disable=SC2086
    LLMSERVE_CUDA_SYNC=1 timeout "$lim" $cs "$BUILD/tests/$t" "$@" 2>&1 | grep -v "^ok" | tail -60
    local rc=${PIPESTATUS[0]}
    local why=""
    case $rc in
    0) return 0 ;;
    9) why=": memcheck found errors" ;;
    77) why=": it saw no CUDA device" ;;
    124) why=": over its ${lim} s" ;;
    esac
    echo "== $t FAILED (exit $rc$why)"
    return 1
}

EB="$BUILD/llmserve-engine-bench --device cuda --load-format dummy --max-model-len 2048 --max-num-seqs 256"

case $STAGE in
build)
    build
    verdict build $? ;;
a)
    have_gpu || { echo "run.sh: no NVIDIA GPU here; stage a skipped"; exit 0; }
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader
    build || verdict a 1 || exit 1
    fail=0
    STORIES=${STORIES_DIR:-$ROOT/../shared/models/stories260K}
    timeout 20 "$BUILD/tests/cuda_plan_test" | tail -3 || fail=1
    sanitized 80 cuda_test || fail=1
    sanitized 100 cuda_model_test "$STORIES" || fail=1
    sanitized 30 nccl_test || fail=1
    verdict a $fail ;;
b)
    have_gpu || { echo "run.sh: no NVIDIA GPU here; stage b skipped"; exit 0; }
    build || verdict b 1 || exit 1
    fail=0
    echo "== kernel bench (llama-3-8b shape, BF16, HBM bound $HBM TB/s)"
    timeout 85 "$BUILD/llmserve-cuda-kernel-bench" --preset llama-3-8b --batches 1,64,256 --ctx 1152 --hbm-tbps "$HBM" || fail=1
    echo "== engine, dummy llama-3-8b BF16, one stream (bound: 16.06 GB / $HBM TB/s = $(python3 -c "print(round($HBM*1000/16.06,1))") tok/s)"
    timeout 80 $EB --model-config llama-3-8b --dtype bf16 --concurrency 1 --prompt-len 1024 --gen 64 --repeats 1 \
        --max-num-batched-tokens 2048 --system-len 1000 || fail=1
    echo "== engine, dummy llama-3-8b --quantization fp8, 64 streams, 1024 in / 128 out"
    timeout 80 $EB --model-config llama-3-8b --dtype bf16 --quantization fp8 --concurrency 64 --prompt-len 1024 \
        --gen 128 --repeats 1 --max-num-batched-tokens 8192 --system-len 1000 || fail=1
    verdict b $fail ;;
c)
    have_gpu || { echo "run.sh: no NVIDIA GPU here; stage c skipped"; exit 0; }
    build || verdict c 1 || exit 1
    fail=0
    PORT=${PORT:-18123}
    echo "== serving: llmserve serve on dummy llama-3-8b BF16, bench serve --sweep max-concurrency=1,8,24"
    "$BUILD/llmserve" serve --device cuda --load-format dummy --model-config llama-3-8b --dtype bf16 --port "$PORT" \
        --max-model-len 2048 --max-num-batched-tokens 8192 --log-level warn >"$BUILD/serve-gpu.log" 2>&1 &
    SP=$!
    python3 - "$PORT" <<'EOF' # ready within 60 s (no curl on every machine)
import sys, time, urllib.request
for _ in range(300):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=1)
        break
    except Exception:
        time.sleep(0.2)
EOF
    timeout 180 "$BUILD/llmserve" bench serve --base-url "http://127.0.0.1:$PORT" --num-prompts 24 \
        --random-input-len 1024 --random-output-len 128 --ignore-eos --sweep max-concurrency=1,8,24 \
        --result-dir "$BUILD/sweep-gpu" 2>/dev/null | sed -n '/==== Sweep/,$p'
    [ "${PIPESTATUS[0]}" = 0 ] || fail=1
    kill $SP 2>/dev/null
    wait $SP 2>/dev/null
    verdict c $fail ;;
d)
    have_gpu || { echo "run.sh: no NVIDIA GPU here; stage d skipped"; exit 0; }
    build || verdict d 1 || exit 1
    echo "== pipeline stages on the GPU: PP=2 (two processes on this GPU, host-staged hops) vs one rank"
    timeout 200 python3 "$ROOT/tests/gpu/pp_gpu.py" "$BUILD" --device cuda 2>&1 | grep -v "^20" | tail -12
    verdict d "${PIPESTATUS[0]}" ;;
x)
    have_gpu || { echo "run.sh: no NVIDIA GPU here; stage x skipped"; exit 0; }
    build || verdict x 1 || exit 1
    fail=0
    echo "== engine, dummy llama-3-70b --quantization fp8 on one GPU (about 74 GB of weights)"
    timeout 120 $EB --model-config llama-3-70b --dtype bf16 --quantization fp8 --concurrency 1,64 --prompt-len 1024 \
        --gen 64 --repeats 1 --max-num-batched-tokens 4096 --system-len 1000 || fail=1
    echo "== engine, dummy llama-3-8b BF16 drafted by a dummy 1B (llama-3.2-1b shape), K=4, cost rule off"
    D1B=$(mktemp -d)
    printf '{"num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": true, "rope_theta": 500000, "max_position_embeddings": 8192}' >"$D1B/config.json"
    timeout 100 $EB --model-config llama-3-8b --dtype bf16 --concurrency 1,64 --prompt-len 1024 --gen 64 --repeats 1 \
        --max-num-batched-tokens 8192 --system-len 1000 \
        --speculative-config "{\"method\": \"draft_model\", \"model\": \"$D1B/config.json\", \"num_speculative_tokens\": 4, \"cost_rule\": false}" ||
        fail=1
    rm -rf "$D1B"
    verdict x $fail ;;
all)
    fail=0
    for s in a b d; do "$0" $s "$BUILD" || fail=1; done
    exit $fail ;;
*)
    echo "usage: tests/gpu/run.sh build|a|b|c|d|x|all [BUILD_DIR]"
    exit 2 ;;
esac
