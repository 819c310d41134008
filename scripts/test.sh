#!/usr/bin/env bash
# Set up .venv with the test dependencies and Ray (idempotent) and run the whole test suite.
# Fails on any test failure and when no test ran (pytest exit code 5).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,ray || exit 1
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: no tests ran -- failing on purpose" >&2
  exit 1
fi
exit "$rc"
