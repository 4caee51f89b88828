# Sourced by the e2e scripts that run the Python references (tests/ref/):
# ref_venv BUILD_DIR sets VENV to BUILD_DIR/.venv-ref with gguf, safetensors,
# tokenizers and numpy installed, or exits 77 (skipped) saying why.
ref_venv() {
    VENV="$1/.venv-ref"
    if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import gguf, safetensors, tokenizers, numpy" 2>/dev/null; then
        [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >/dev/null 2>&1 || { echo "python3 venv unavailable"; exit 77; }
        "$VENV/bin/pip" install -q gguf safetensors tokenizers numpy >/dev/null 2>&1 ||
            { echo "pip install gguf safetensors tokenizers numpy failed (offline?)"; exit 77; }
    fi
}

# ref_models BUILD_DIR MODEL SCRIPT: the setup of an e2e that runs a tests/ref/ maker: BUILD (absolute), MODEL
# (skips when absent), VENV, OUT (a temporary folder under BUILD, removed at exit with every pid in PIDS
# killed), then tests/ref/SCRIPT.py MODEL OUT, its output shown only when it fails.
ref_models() {
    BUILD=$(cd "$1" && pwd)
    MODEL=$2
    [ -f "$MODEL" ] || { echo "model $MODEL not found: run tools/setup.sh"; exit 77; }
    ref_venv "$BUILD"
    OUT=$(mktemp -d "$BUILD/$3-e2e.XXXXXX")
    PIDS=()
    trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$OUT"' EXIT
    "$VENV/bin/python" "$HERE/../ref/$3_ref.py" "$MODEL" "$OUT" >"$OUT/ref.log" 2>&1 || { cat "$OUT/ref.log"; exit 1; }
}
