#!/usr/bin/env bash
# Create .venv-peers: lmdata + the loaders bench/peers.py compares it with (LitData, Mosaic
# Streaming), in a venv of their own. Idempotent (a stamp keyed on this script and pyproject.toml).
#
# Why a separate venv: mosaicml-streaming 0.13 pins numpy<2.2, and both peers ask for
# torchvision, whose PyPI wheel pulls a CUDA torch and does not import beside the CPU wheel.
# So torch==2.13.0 (the CPU build) goes in first, then lmdata with its `peers` extra (what
# the peers need at run time), then the two peers themselves with --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${LMDATA_PEERS_VENV:-.venv-peers}"
stamp="$venv/.peers-installed-$(cat pyproject.toml scripts/setup-peers.sh | sha256sum | cut -c1-16)"
[ -f "$stamp" ] && exit 0

# torch first (setup.sh's rule: never let pip resolve torch), then lmdata[peers]
LMDATA_VENV="$venv" bash scripts/setup.sh dev,peers
py="$venv/bin/python"
echo "setup-peers: installing litdata==0.2.76, mosaicml-streaming==0.13.0 (--no-deps) into $venv" >&2
"$py" -m pip install -q --no-deps "litdata==0.2.76" "mosaicml-streaming==0.13.0"
# Mosaic's streaming/__init__.py imports streaming.vision, hence torchvision (absent here, on
# purpose); its loader lives in streaming.base, so the check (and bench/peers.py) import that
# with the package's __init__ skipped. Mosaic's own code runs unchanged.
"$py" - <<'EOF'
import importlib.util, sys, types
spec = importlib.util.find_spec("streaming")
pkg = types.ModuleType("streaming"); pkg.__path__ = list(spec.submodule_search_locations); pkg.__spec__ = spec
sys.modules["streaming"] = pkg
from streaming.base import StreamingDataset, MDSWriter  # noqa: F401
from streaming._version import __version__ as streaming_version
import litdata, torch
from litdata import optimize, StreamingDataLoader, TokensLoader  # noqa: F401
assert torch.__version__.startswith("2.13.0"), torch.__version__
print(f"setup-peers: litdata {litdata.__version__}, streaming {streaming_version}, torch {torch.__version__}")
EOF
touch "$stamp"
