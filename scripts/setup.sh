#!/usr/bin/env bash
# Create .venv and install lmdata into it. Idempotent: reruns are a no-op unless
# pyproject.toml changed. Extras to install: $1 (e.g. "dev", "dev,bench").
#
# torch: a CPU machine gets torch==2.13.0 (a CPU wheel); set LMDATA_TORCH to another pip
# spec (e.g. "torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124") to bring
# your own build, or LMDATA_TORCH=skip when the venv already has the torch you want.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="train${1:+,$1}"  # the train extra (torch) is always wanted here: torch is installed first, below
venv="${LMDATA_VENV:-.venv}"
python="${PYTHON:-python3}"

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
py="$venv/bin/python"

# setup.py and the C sources are hashed too: editing them rebuilds the C extensions
base="$venv/.lmdata-installed-$(cat pyproject.toml setup.py src/lmdata/tokenizer/_fastbpe*.c src/lmdata/io/_*.c src/lmdata/data/_*.c | sha256sum | cut -c1-16)"
stamp="$base-${extras//,/_}"
covered() {  # these sources are installed with every extra asked for (e.g. `setup.sh dev`, then demo.sh's none)
  local f have want
  for f in "$base"-*; do
    [ -f "$f" ] || continue
    have="_${f#"$base"-}_"
    for want in ${extras//,/ }; do
      [[ "$have" == *"_${want}_"* ]] || continue 2
    done
    return 0
  done
  return 1
}
if covered; then exit 0; fi

"$py" -m pip install -q --upgrade pip >/dev/null
if ! "$py" -c "import torch" 2>/dev/null; then
  if [ -n "${LMDATA_TORCH:-}" ]; then
    if [ "$LMDATA_TORCH" != "skip" ]; then
      echo "setup: installing $LMDATA_TORCH" >&2
      # shellcheck disable=SC2086
      "$py" -m pip install -q $LMDATA_TORCH
    fi
  else
    # The CPU build: a local wheel (pip's find-links) when the machine has one, else
    # PyTorch's CPU index. Plain PyPI would hand Linux a multi-GB CUDA build.
    echo "setup: installing torch==2.13.0 (CPU build)" >&2
    if "$py" -m pip install -q --no-index --no-deps torch==2.13.0 2>/dev/null; then
      "$py" -m pip install -q torch==2.13.0
    else
      "$py" -m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
        --extra-index-url https://pypi.org/simple
    fi
  fi
fi
target="."
[ -n "$extras" ] && target=".[$extras]"
echo "setup: installing lmdata$([ -n "$extras" ] && echo "[$extras]") into $venv" >&2
"$py" -m pip install -q -e "$target"
touch "$stamp"
