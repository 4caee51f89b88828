#!/usr/bin/env bash
# The libraries the build needs and a GPU machine may lack (NNG, protobuf-c and
# its compiler, jansson, libevent, xxHash, pkg-config), as Debian packages in
# one folder that travels with the repository (tests/gpu/run.sh unpacks them
# into its build folder when the machine it runs on has none of its own).
# Run it here, where apt works; about 3.5 MB.
#   tests/gpu/devlibs.sh [DIR]      (default .devlibs in the repository root, git-ignored)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${1:-$ROOT/.devlibs}
PKGS="libnng1 libnng-dev libmbedtls14 libmbedx509-1 libmbedcrypto7
      libprotobuf-c1 libprotobuf-c-dev protobuf-c-compiler libprotoc32 libprotobuf32
      libjansson4 libjansson-dev libxxhash0 libxxhash-dev
      libevent-2.1-7 libevent-core-2.1-7 libevent-extra-2.1-7 libevent-pthreads-2.1-7 libevent-openssl-2.1-7
      libevent-dev pkgconf pkgconf-bin libpkgconf3"
command -v apt-get >/dev/null || { echo "devlibs.sh: needs apt-get (a Debian or Ubuntu machine)"; exit 1; }
mkdir -p "$DIR"
rm -f "$DIR"/*.deb
# apt-get download writes into the current folder; run as root it warns that _apt cannot write there
(cd "$DIR" && apt-get download $PKGS 2>&1 | grep -v "^Get:\|unsandboxed" || true)
n=$(find "$DIR" -maxdepth 1 -name '*.deb' | wc -l)
want=$(echo $PKGS | wc -w)
[ "$n" = "$want" ] || { echo "devlibs.sh: $n of $want packages downloaded into $DIR (apt-get update first?)"; exit 1; }
echo "devlibs.sh: $n packages, $(du -sh "$DIR" | cut -f1), in $DIR"
