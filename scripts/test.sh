#!/usr/bin/env bash
# Set up .venv with the test dependencies and Ray (idempotent) and run the whole test suite.
# Fails on any test failure and when no test ran (pytest exit code 5).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev,ray || exit 1
# Two processes, a test file each (pytest-xdist, --dist loadfile: a module's fixtures are made
# once): most tests wait on subprocesses, servers or sleeps, so on 2 cores the suite takes
# ~10 min instead of ~13-18 (measured on the 2-core dev VM). LMDATA_TEST_PROCESSES=0 runs it in
# this process; a -n given as an argument wins too.
.venv/bin/python -m pytest -n "${LMDATA_TEST_PROCESSES:-2}" --dist loadfile "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: no tests ran -- failing on purpose" >&2
  exit 1
fi
exit "$rc"
