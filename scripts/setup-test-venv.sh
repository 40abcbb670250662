#!/usr/bin/env bash
# Makes .venv-test: a Python virtualenv with the pinned `openai` SDK for tests/python
# (ctest OpenaiClient.PythonSdk). Reuses an existing one that already has that version, so it
# works offline once made.
set -euo pipefail
cd "$(dirname "$0")/.."
OPENAI_VERSION=2.8.0
VENV=${QSPEC_TEST_VENV:-.venv-test}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
  echo "qspec: $VENV has openai $OPENAI_VERSION"
  exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "openai==$OPENAI_VERSION"
echo "qspec: $VENV made with openai $OPENAI_VERSION"
