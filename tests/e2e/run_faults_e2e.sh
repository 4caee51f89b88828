#!/usr/bin/env bash
# Faults, drains and hostile clients (test_faults.py), then the cluster
# behind haproxy (test_cluster.py), against real processes on loopback.
#   run_faults_e2e.sh BUILD_DIR MODEL [faults|cluster]
# Exit 77 (skipped) when the model is missing; the cluster part skips
# itself when haproxy is not installed.
set -uo pipefail
BUILD=$(cd "$1" && pwd)
MODEL=$2
WHICH=${3:-faults}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f "$MODEL" ] || { echo "model $MODEL not found: run tools/setup.sh"; exit 77; }
command -v python3 >/dev/null || { echo "python3 not found"; exit 77; }
exec python3 -u "$HERE/test_$WHICH.py" "$BUILD" "$MODEL"
