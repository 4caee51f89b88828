#!/usr/bin/env bash
# Builds the CPU image (deploy/docker/Dockerfile.cpu) with podman, runs it
# with the model mounted read-only, a read-only root filesystem and the
# image's non-root user, and sends a chat request through it with the
# openai client. Prints the image's size and the time from `podman run` to
# a ready /health. Then `podman kube play` runs the cpu-small manifests themselves (tests/deploy/kube_play.py).
#   tests/deploy/image_test.sh BUILD_DIR MODEL [PYTHON]
# Skips (77) where podman is missing. No registry is needed: the base image
# is made from Debian's packages with mmdebstrap when it is not there yet.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
PY=${3:-python3}
[ -f "$MODEL" ] || { echo "image_test: model $MODEL not found: run tools/setup.sh"; exit 77; }
command -v podman >/dev/null || { echo "image_test: podman not found (apt-get install podman runc mmdebstrap uidmap): skipped"; exit 77; }
"$PY" -c "import openai" 2>/dev/null || { echo "image_test: the openai client is not installed for $PY: skipped"; exit 77; }
# this machine's podman: runc and cgroupfs (crun and the systemd cgroup manager fail here)
PODMAN=(podman --runtime runc --cgroup-manager=cgroupfs)
BASE=${LLMSERVE_IMAGE_BASE:-localhost/debian-base:bookworm}
if ! "${PODMAN[@]}" image exists "$BASE"; then
    command -v mmdebstrap >/dev/null || { echo "image_test: no base image $BASE and no mmdebstrap to make one: skipped"; exit 77; }
    tmp=$(mktemp -d)
    echo "image_test: making $BASE with mmdebstrap"
    mmdebstrap --variant=minbase --quiet bookworm "$tmp/base.tar"
    "${PODMAN[@]}" import "$tmp/base.tar" "$BASE" >/dev/null
    rm -rf "$tmp"
fi
TAG=localhost/llmserve:cpu-test
t0=$(date +%s)
"${PODMAN[@]}" build --quiet --network host --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 \
    --build-arg BASE="$BASE" -f "$ROOT/deploy/docker/Dockerfile.cpu" -t "$TAG" "$ROOT" >/dev/null
echo "image_test: built $TAG in $(( $(date +%s) - t0 )) s, $("${PODMAN[@]}" image inspect "$TAG" --format '{{.Size}}' | awk '{printf "%.0f MB", $1/1e6}')"
PORT=$(cd "$ROOT/tests" && "$PY" -c 'from ports import free_port; print(free_port())')
NAME=llmserve-image-test-$$
cleanup() { "${PODMAN[@]}" rm -f "$NAME" >/dev/null 2>&1 || true; }
trap cleanup EXIT
t0=$(date +%s.%N)
"${PODMAN[@]}" run -d --name "$NAME" --network host --read-only --tmpfs /tmp \
    --ulimit nofile=1024:1024 --ulimit nproc=4096:4096 \
    -v "$(dirname "$MODEL")":/models:ro "$TAG" \
    serve "/models/$(basename "$MODEL")" --host 127.0.0.1 --port "$PORT" \
    --kv-cache-memory 256MiB --max-model-len 2048 >/dev/null
ready=""
for _ in $(seq 1 300); do
    if curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then ready=1; break; fi
    sleep 0.2
done
if [ -z "$ready" ]; then
    "${PODMAN[@]}" logs "$NAME" | tail -20
    echo "FAIL image_test: the container never became ready"
    exit 1
fi
echo "image_test: ready $("$PY" -c "import time; print('%.1f' % (time.time() - $t0))") s after podman run"
user=$("${PODMAN[@]}" exec "$NAME" id -u)
[ "$user" = 10001 ] || { echo "FAIL image_test: runs as uid $user, not 10001"; exit 1; }
"$PY" - "$PORT" <<'PY'
import sys
from openai import OpenAI
c = OpenAI(base_url="http://127.0.0.1:%s/v1" % sys.argv[1], api_key="none")
model = c.models.list().data[0].id
r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
                              max_tokens=16, temperature=0)
text = r.choices[0].message.content
assert r.choices[0].finish_reason in ("stop", "length") and text, r
print("image_test: chat through the container (%s): %r" % (model, text))
PY
t0=$(date +%s)
"${PODMAN[@]}" stop -t 40 "$NAME" >/dev/null
code=$("${PODMAN[@]}" inspect "$NAME" --format '{{.State.ExitCode}}')
[ "$code" = 0 ] || { "${PODMAN[@]}" logs "$NAME" | tail -10; echo "FAIL image_test: exit code $code after SIGTERM"; exit 1; }
echo "image_test: SIGTERM drained and exited 0 in $(( $(date +%s) - t0 )) s"
# the manifests themselves, run: the cpu-small worker leader and gateway as pods of this image
if ! command -v catatonit >/dev/null; then
    echo "image_test: catatonit not installed (apt-get install catatonit): podman kube play of the manifests skipped"
elif ! "$PY" -c "import yaml" 2>/dev/null; then
    echo "image_test: PyYAML missing for $PY: podman kube play of the manifests skipped"
else
    "$PY" -u "$ROOT/tests/deploy/kube_play.py" "$1" "$MODEL" "$TAG" || { echo "FAIL image_test: kube play"; exit 1; }
fi
echo "image_test: 0 checks failed"
