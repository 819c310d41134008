"""Datasets and the loader: windows over a split, shuffling, sharding, workers, resume.

Exports load lazily (``lmdata.data.make_loader`` imports torch; ``TokenDataset`` does not),
so importing this package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TokenDataset": "lmdata.data.dataset",
    "MixedDataset": "lmdata.data.mixed",
    "Permutation": "lmdata.data.permutation",
    "make_loader": "lmdata.data.loader",
    "TokenLoader": "lmdata.data.loader",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'lmdata.data' has no attribute {name!r}")
