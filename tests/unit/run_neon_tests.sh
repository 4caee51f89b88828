#!/usr/bin/env bash
# The ARM NEON path, cross-built for aarch64 and run under qemu-user:
# kernels_test (every kernel, both NEON variants, against the references),
# model_test (the default model's golden logits and greedy tokens, with
# NEON attention) and a short greedy `llmserve generate`, which must give the
# same text on the plain NEON and the sdot path. Correctness only: qemu's
# speed says nothing about a real ARM CPU's.
#   tests/unit/run_neon_tests.sh BUILD_DIR MODEL
# Needs Debian's gcc-aarch64-linux-gnu, qemu-user and the arm64 -dev
# libraries (tools/setup.sh cross installs them); skips (77) without them.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:?build dir}/arm64
MODEL=${2:?model}
skip() { echo "neon: skipped: $*"; exit 77; }
command -v aarch64-linux-gnu-gcc >/dev/null || skip "no aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu, or tools/setup.sh cross)"
command -v qemu-aarch64 >/dev/null || skip "no qemu-aarch64 (apt-get install qemu-user, or tools/setup.sh cross)"
for f in pkgconfig/jansson.pc pkgconfig/libxxhash.pc pkgconfig/libprotobuf-c.pc cmake/nng; do
    [ -e "/usr/lib/aarch64-linux-gnu/$f" ] ||
        skip "no arm64 $(basename "$f" .pc) (dpkg --add-architecture arm64 and the :arm64 -dev packages, or tools/setup.sh cross)"
done
[ -f "$MODEL" ] || skip "model $MODEL absent (run tools/setup.sh)"

cmake -S "$ROOT" -B "$OUT" -DCMAKE_TOOLCHAIN_FILE="$ROOT/tools/cmake/aarch64-linux-gnu.cmake" \
    -DCMAKE_BUILD_TYPE=Release -DLLMSERVE_CUDA=OFF -DLLMSERVE_GATEWAY=OFF -DBUILD_TESTING=ON >/dev/null
cmake --build "$OUT" -j "${JOBS:-$(nproc)}" --target kernels_test model_test llmserve >/dev/null
file "$OUT/tests/kernels_test" | grep -q 'ARM aarch64' || { echo "neon: FAIL: not an aarch64 binary"; exit 1; }
QEMU=(qemu-aarch64 -L /) # the arm64 libc of the multiarch install: the cross one may be another version

echo "neon: kernels_test under qemu-aarch64"
"${QEMU[@]}" "$OUT/tests/kernels_test" | tee "$OUT/kernels_test.log"
grep -q '  neon: tested' "$OUT/kernels_test.log" || { echo "neon: FAIL: the NEON path was not tested"; exit 1; }
grep -q '  neon-dotprod: tested' "$OUT/kernels_test.log" || { echo "neon: FAIL: the sdot path was not tested"; exit 1; }

echo "neon: model_test under qemu-aarch64 (the first golden prompt: the NEON kernels are the same for all four)"
MODEL_TEST_GOLDEN_CASES=1 "${QEMU[@]}" "$OUT/tests/model_test" "$MODEL" "$ROOT/tests/data/smollm2_golden.json" /nonexistent

prompt="The capital of France is"
for isa in neon neon-dotprod; do
    LLMSERVE_ISA=$isa "${QEMU[@]}" "$OUT/llmserve" generate --model "$MODEL" --prompt "$prompt" -n 12 \
        --temperature 0 --threads 2 >"$OUT/gen-$isa.txt" 2>"$OUT/gen-$isa.err" ||
        { cat "$OUT/gen-$isa.err"; echo "neon: FAIL: generate on $isa"; exit 1; }
    grep -q "threads, $isa)" "$OUT/gen-$isa.err" || { cat "$OUT/gen-$isa.err"; echo "neon: FAIL: $isa not used"; exit 1; }
    echo "neon: generate ($isa): $(tr '\n' ' ' <"$OUT/gen-$isa.txt")"
done
[ -s "$OUT/gen-neon.txt" ] || { echo "neon: FAIL: empty output"; exit 1; }
cmp -s "$OUT/gen-neon.txt" "$OUT/gen-neon-dotprod.txt" ||
    { echo "neon: FAIL: the two NEON paths disagree (their integer sums are exact, so they must not)"; exit 1; }
echo "neon: ok"
