#!/usr/bin/env bash
# Proves that tests/gpu/run.sh builds on a machine that has only what the GPU
# machine's image lists (CUDA, CMake, ninja, a C compiler, Python, git): a
# Debian chroot made with mmdebstrap from exactly those packages, this
# machine's CUDA toolkit bound in read-only, a copy of this working tree (what a device call carries) and
# its .devlibs/ copied in, then `run.sh build` inside. Root and mmdebstrap
# needed; about 3 minutes of downloads and 5 of building on 2 cores.
#   tests/gpu/cleanroom.sh [WORKDIR]     (default /tmp/llmserve-cleanroom; removed at the end unless KEEP=1)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
W=${1:-/tmp/llmserve-cleanroom}
[ "$(id -u)" = 0 ] || { echo "cleanroom.sh: needs root (chroot, mounts)"; exit 77; }
command -v mmdebstrap >/dev/null || { echo "cleanroom.sh: needs mmdebstrap (apt-get install mmdebstrap)"; exit 77; }
command -v nvcc >/dev/null || { echo "cleanroom.sh: needs nvcc on the PATH (the CUDA toolkit to bind in)"; exit 77; }
command -v unshare >/dev/null || { echo "cleanroom.sh: needs unshare (util-linux)"; exit 77; }
# Every mount below lives in a mount namespace of this script's own: it goes when the script does, even
# killed (a ctest timeout), so no bind of /dev or of the toolkit outlives it on the host.
if [ -z "${CLEANROOM_NS:-}" ]; then
    CLEANROOM_NS=1 exec unshare --mount --propagation private bash "$0" "$@"
fi
CUDA=$(readlink -f "$(dirname "$(command -v nvcc)")/..")
case "$CUDA" in # a toolkit bound over the chroot's own system folders would bring the host's libraries in with it
    / | /usr | /usr/local | /bin | /lib | /lib64 | /opt)
        echo "cleanroom.sh: nvcc lives in $CUDA (a distribution's package?); binding that into the chroot would hide its own files; skipped"
        exit 77 ;;
esac
R=$W/root
DEVLIBS=$ROOT/.devlibs
cleanup() {
    for m in "$R$CUDA" "$R/proc" "$R/dev"; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
    [ "${KEEP:-0}" = 1 ] || rm -rf --one-file-system "$W"
}
trap cleanup EXIT
rm -rf --one-file-system "$W"
mkdir -p "$W"
echo "cleanroom.sh: a bookworm chroot with cmake, ninja, python3, g++, make, git and nothing else"
if ! ls "$DEVLIBS"/*.deb >/dev/null 2>&1; then
    DEVLIBS=$W/devlibs
    "$ROOT/tests/gpu/devlibs.sh" "$DEVLIBS" || { echo "cleanroom.sh: could not download .devlibs (apt?); skipped"; exit 77; }
fi
mmdebstrap --quiet --variant=minbase --include=cmake,ninja-build,python3,g++,make,git bookworm "$R" >"$W/mmdebstrap.log" 2>&1 ||
    { tail -5 "$W/mmdebstrap.log"; echo "cleanroom.sh: mmdebstrap could not make the chroot (no Debian mirror?); skipped"; exit 77; }
for h in nng/nng.h protobuf-c/protobuf-c.h jansson.h event2/event.h xxhash.h; do # (cmake itself pulls libjansson4)
    if [ -e "$R/usr/include/$h" ]; then echo "cleanroom.sh: $h is in the chroot"; exit 1; fi
done
for cmd in protoc-c pkg-config; do
    if [ -e "$R/usr/bin/$cmd" ]; then echo "cleanroom.sh: $cmd is in the chroot"; exit 1; fi
done
mkdir -p "$R$CUDA" "$R/src"
mount --bind "$CUDA" "$R$CUDA"
mount -o remount,bind,ro "$R$CUDA"
mount -t proc proc "$R/proc"
mount --bind /dev "$R/dev"
# run.sh looks for the toolkit at /usr/local/cuda: where it lives somewhere else, a link there (where it lives
# at /usr/local/cuda itself, as on many machines, the bind above already put it there)
[ "$CUDA" = /usr/local/cuda ] || ln -sfn "$CUDA" "$R/usr/local/cuda"
# what a device call carries: tracked and untracked-not-ignored files, and .devlibs
mkdir -p "$R/src/llmserve"
(cd "$ROOT" && git ls-files -z -co --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$R/src/llmserve"
cp -r "$DEVLIBS" "$R/src/llmserve/.devlibs"
start=$SECONDS
rc=0
chroot "$R" /usr/bin/env -i PATH="/usr/local/cuda/bin:/usr/bin:/bin" HOME=/root \
    bash /src/llmserve/tests/gpu/run.sh build /src/build-gpu || rc=$?
echo "cleanroom.sh: run.sh build exited $rc after $((SECONDS - start)) s"
[ $rc = 0 ] || exit $rc
# the programs load there with what run.sh puts on LD_LIBRARY_PATH: with no GPU in the chroot the CUDA tests
# skip (77), which they can only do once every library they link was found
LIBS=/src/build-gpu/sysroot/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64
for t in cuda_test cuda_model_test nccl_test; do
    trc=0
    chroot "$R" /usr/bin/env -i LD_LIBRARY_PATH=$LIBS /src/build-gpu/tests/$t >"$W/$t.log" 2>&1 || trc=$?
    echo "cleanroom.sh: $t in the chroot: exit $trc ($(tail -1 "$W/$t.log"))"
    [ $trc = 77 ] || exit 1
done
