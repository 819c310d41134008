"""Datasets and the loader: windows over a split, shuffling, sharding, workers, resume.

Exports load lazily (``lmdata.data.make_loader`` imports torch; ``TokenDataset`` does not),
so importing this package stays cheap.
"""

from __future__ import annotations

from lmdata._lazy import lazy_exports

_EXPORTS = {
    "TokenDataset": "lmdata.data.dataset",
    "MixedDataset": "lmdata.data.mixed",
    "Permutation": "lmdata.data.permutation",
    "make_loader": "lmdata.data.loader",
    "TokenLoader": "lmdata.data.loader",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
