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
