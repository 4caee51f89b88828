#!/usr/bin/env bash
# The TCP backend of a CPU tensor-parallel group across hosts, against its link: rank 0 and rank 1 of
# llmserve-comm-bench in two network namespaces on a bridge (tests/e2e/netns.py; root), or on loopback
# where namespaces cannot be made.   usage: tests/bench/comm_tcp.sh BUILD [DIM]
set -euo pipefail
BUILD=$(cd "${1:?usage: comm_tcp.sh BUILD [DIM]}" && pwd)
DIM=${2:-576}
HERE=$(cd "$(dirname "$0")/.." && pwd)
NETNS="$HERE/e2e/netns.py"
TAG="llcb$(( $$ % 10000 ))"
OUT=$(mktemp)
if python3 -c "import sys; sys.path.insert(0, '$HERE/e2e'); import netns; sys.exit(1 if netns.available() else 0)"; then
    trap 'python3 "$NETNS" down --tag "$TAG" >/dev/null; rm -f "$OUT"' EXIT
    python3 "$NETNS" up 2 --tag "$TAG" >/dev/null
    echo "two network namespaces on a bridge (veth): rank 0 at 10.77.0.1, rank 1 at 10.77.0.2"
    R0=(ip netns exec "$TAG-n0")
    R1=(ip netns exec "$TAG-n1")
    HOST=10.77.0.1
else
    trap 'rm -f "$OUT"' EXIT
    echo "no network namespaces here: both ranks on loopback"
    R0=()
    R1=()
    HOST=127.0.0.1
fi
"${R0[@]}" "$BUILD/llmserve-comm-bench" --rank 0 --dim "$DIM" > "$OUT" &
P0=$!
for _ in $(seq 100); do grep -q '^port ' "$OUT" && break; sleep 0.1; done
PORT=$(awk '/^port /{print $2}' "$OUT")
"${R1[@]}" "$BUILD/llmserve-comm-bench" --rank 1 --host "$HOST" --port "$PORT" --dim "$DIM"
wait "$P0"
grep -v '^port ' "$OUT"
