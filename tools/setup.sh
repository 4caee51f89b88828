#!/usr/bin/env bash
# llmserve set-up: installs what is missing, builds, fetches the default model,
# then serves the OpenAI API or runs the tests.
#
#   tools/setup.sh serve [serve flags...]      set up, then `llmserve serve` (http://127.0.0.1:8000)
#   tools/setup.sh test                        set up, then run the whole test suite (ctest)
#   tools/setup.sh build                       set up only
#   tools/setup.sh cross                       add what the NEON test needs on an x86 Debian host
#                                              (gcc-aarch64-linux-gnu, qemu-user, arm64 -dev libraries;
#                                              `test` does this too when CI=true or LLMSERVE_CROSS=1)
#
# Idempotent: every step checks first and skips what is already there.
# Environment: BUILD_DIR (default build), JOBS, LLMSERVE_SANITIZE_TESTS=1 to
# also run the suite under ASan+UBSan (CI does).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
MODE=${1:-serve}
[ $# -gt 0 ] && shift
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
MODEL_DIR="$ROOT/models"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
DEB_PACKAGES=(build-essential cmake pkg-config libevent-dev libnng-dev libprotobuf-c-dev
              protobuf-c-compiler libjansson-dev libxxhash-dev libhiredis-dev python3 python3-pip)
# only for `test`: libFuzzer (clang), the e2e tests (curl, a venv for the
# openai client), promtool (prometheus) to check /metrics, haproxy for the cluster test and haproxy and
# nginx for the pooling-proxy test, podman (runc, mmdebstrap for a base image, uidmap) to build and run the CPU image,
# catatonit for the pods `podman kube play` makes of the manifests, redis-server for the shared response store
TEST_PACKAGES=(clang curl python3-venv prometheus haproxy nginx-light podman runc catatonit mmdebstrap uidmap redis-server)

say() { printf '\033[1msetup:\033[0m %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

install_packages() {
    local missing=() want=("${DEB_PACKAGES[@]}")
    [ "$MODE" = test ] && want+=("${TEST_PACKAGES[@]}")
    for p in "${want[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    # python3 and pip may come from elsewhere (pyenv, a venv): accept them
    if command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
        local keep=()
        local venv_ok=0
        python3 -m venv --help >/dev/null 2>&1 && venv_ok=1
        for p in "${missing[@]}"; do
            [[ $p == python3 || $p == python3-pip || ($p == python3-venv && $venv_ok == 1) ]] || keep+=("$p")
        done
        missing=("${keep[@]+"${keep[@]}"}")
    fi
    if [ ${#missing[@]} -eq 0 ]; then
        say "packages: all present"
        return
    fi
    command -v apt-get >/dev/null || die "missing packages (${missing[*]}) and no apt-get: install them by hand"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    say "packages: installing ${missing[*]}"
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# The ARM NEON path is tested on x86 by cross-building for aarch64 and running under qemu-user
# (ctest neon_qemu; the gateway is left out: libevent-dev is one architecture only). It adds the
# arm64 architecture to dpkg, so a developer's `test` asks for it
# (LLMSERVE_CROSS=1); CI always does.
CROSS_PACKAGES=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user file)
CROSS_ARM64_LIBS=(libc6-dev:arm64 libjansson-dev:arm64 libxxhash-dev:arm64 libprotobuf-c-dev:arm64
                  libnng-dev:arm64)
install_cross() {
    [ "$(uname -m)" = x86_64 ] || { say "cross: not an x86_64 host; NEON runs natively here"; return; }
    command -v apt-get >/dev/null || { say "cross: no apt-get; the NEON test will skip"; return; }
    local missing=() sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    for p in "${CROSS_PACKAGES[@]}" "${CROSS_ARM64_LIBS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        say "cross: all present"
        return
    fi
    say "cross: installing ${missing[*]}"
    dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" ||
        say "cross: install failed; the NEON test will skip"
}

build() {
    say "build: $BUILD_DIR (jobs $JOBS)"
    cmake -S "$ROOT" -B "$ROOT/$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
    # shellcheck disable=SC2086
    cmake --build "$ROOT/$BUILD_DIR" -j "$JOBS" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
}

# the chat model; with "all" also the embedding model the tests use
fetch_model() {
    "$ROOT/tools/fetch_model.sh" "$MODEL_DIR" "${1:-default}"
}

run_tests() {
    say "tests: ctest in $BUILD_DIR"
    # one test at a time: each one runs its own thread pool over all cores
    ctest --test-dir "$ROOT/$BUILD_DIR" --output-on-failure
    if [ "${LLMSERVE_SANITIZE_TESTS:-0}" = 1 ]; then
        say "tests: again under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan)"
        BUILD_DIR=build-asan CMAKE_ARGS="-DLLMSERVE_SANITIZE=ON -DLLMSERVE_CUDA=OFF" build
        ctest --test-dir "$ROOT/build-asan" --output-on-failure
        say "tests: the threaded parts under ThreadSanitizer (build-tsan: thread pool, engine, RPC threads, TP comm)"
        BUILD_DIR=build-tsan CMAKE_ARGS="-DLLMSERVE_TSAN=ON -DLLMSERVE_CUDA=OFF" \
            BUILD_TARGETS="kernels_test blocks_test tier_test gateway_test route_test engine_test engine_spec_test tp_test worker_test llmserve-worker" build
        TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}" \
            ctest --test-dir "$ROOT/build-tsan" --output-on-failure -R '^(kernels_test|blocks_test|tier_test|gateway_test|route_test|engine_test|engine_spec_test|tp_test|worker_test)$'
    fi
    if command -v clang >/dev/null; then
        local secs=${LLMSERVE_FUZZ_SECONDS:-8}
        say "tests: libFuzzer, ${secs} s on each target from a fixed seed (build-fuzz; tools/fuzz.sh unseeded explores further)"
        FUZZ_SEED=${FUZZ_SEED:-1} JOBS=$JOBS "$ROOT/tools/fuzz.sh" "$secs"
    else
        say "tests: clang not found, libFuzzer run skipped (the mutation replays ran in ctest)"
    fi
}

case "$MODE" in
serve)
    install_packages; build; fetch_model
    say "serving $MODEL_FILE: OpenAI API on http://127.0.0.1:8000/v1 (Ctrl-C stops)"
    exec "$ROOT/$BUILD_DIR/llmserve" serve "$MODEL_DIR/$MODEL_FILE" "$@"
    ;;
test)
    install_packages
    if [ "${CI:-}" = true ] || [ "${LLMSERVE_CROSS:-0}" = 1 ]; then install_cross; fi
    build; fetch_model all; run_tests
    ;;
cross)
    install_cross
    ;;
build)
    install_packages; build; fetch_model all
    ;;
*)
    die "unknown mode '$MODE' (serve | test | build | cross)"
    ;;
esac
