#!/usr/bin/env bash
# libFuzzer runs of the fuzz targets (tests/fuzz/), built with clang in
# build-fuzz. Each target starts from its committed seeds
# (tests/fuzz/corpus/NAME) and keeps what it finds in build-fuzz/corpus-NAME.
#   tools/fuzz.sh [SECONDS_EACH] [TARGET...]     (default 10 s; all targets)
# A crash stops the run with the fuzzer's report (exit 1); the input is
# left as build-fuzz/crash-* to add to the seeds once fixed.
# FUZZ_SEED=N fixes libFuzzer's random seed, so a run explores the same
# inputs each time (the test suite's short run uses 1: a gate that a change
# can fail, not a lottery); unset, each run explores anew.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECS=${1:-10}
shift || true
TARGETS=${*:-envelope oai chat tokenizer gguf grammar http hf anth resp kvblock}
command -v clang >/dev/null || { echo "fuzz: clang not found"; exit 77; }
cmake -S "$ROOT" -B "$ROOT/build-fuzz" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang -DLLMSERVE_FUZZ=ON \
    -DLLMSERVE_CUDA=OFF -DBUILD_TESTING=ON >/dev/null
for t in $TARGETS; do
    cmake --build "$ROOT/build-fuzz" -j "${JOBS:-$(nproc)}" --target "fuzz_$t" >/dev/null
done
export LLMSERVE_FUZZ_MODEL=${LLMSERVE_FUZZ_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$LLMSERVE_FUZZ_MODEL" ] || unset LLMSERVE_FUZZ_MODEL   # the tokenizer target falls back to a synthetic one
cd "$ROOT/build-fuzz"
for t in $TARGETS; do
    mkdir -p "corpus-$t"
    seeds=()
    [ -d "$ROOT/tests/fuzz/corpus/$t" ] && seeds=("$ROOT/tests/fuzz/corpus/$t")
    len=65536
    [ "$t" = gguf ] && len=262144
    log=$(mktemp)
    seed=()
    [ -n "${FUZZ_SEED:-}" ] && seed=(-seed="$FUZZ_SEED")
    if ! "./tests/fuzz_$t" "${seed[@]}" -max_total_time="$SECS" -max_len=$len -timeout=20 -rss_limit_mb=4096 \
            -artifact_prefix="crash-$t-" -print_final_stats=1 "corpus-$t" "${seeds[@]}" >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz: fuzz_$t failed; the input is in build-fuzz/crash-$t-*"
        exit 1
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
    echo "fuzz: fuzz_$t ${SECS} s: ${execs:-?} inputs, ${cov:-cov: ?} edges, corpus $(ls "corpus-$t" | wc -l) files"
    rm -f "$log"
done
