#!/usr/bin/env bash
# The deployment checks, with their Python packages in the e2e venv:
#   run_deploy_tests.sh BUILD_DIR MODEL manifests|image
set -uo pipefail
BUILD=$1
MODEL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
VENV="$BUILD/.venv-e2e"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV" >/dev/null 2>&1 || { echo "python3 venv unavailable: skipped"; exit 77; }
fi
if ! "$VENV/bin/python" -c "import openai, yaml, jsonschema, kubernetes_validate" 2>/dev/null; then
    "$VENV/bin/pip" install -q openai pyyaml kubernetes-validate >/dev/null 2>&1 ||
        { echo "pip install openai pyyaml kubernetes-validate failed (offline?): skipped"; exit 77; }
fi
# Helm's own engine (Helm v4's Go SDK in a wheel): the chart is rendered as `helm install` would
if ! "$VENV/bin/python" -c "import helm_python" 2>/dev/null; then
    "$VENV/bin/pip" install -q helm-python-sdk >/dev/null 2>&1 ||
        echo "pip install helm-python-sdk failed (offline?): the chart will not be rendered with Helm"
fi
case "$3" in
manifests) exec "$VENV/bin/python" -u "$HERE/test_manifests.py" "$BUILD" "$MODEL" ;;
image) exec "$HERE/image_test.sh" "$BUILD" "$MODEL" "$VENV/bin/python" ;;
*) echo "run_deploy_tests.sh: manifests or image"; exit 2 ;;
esac
