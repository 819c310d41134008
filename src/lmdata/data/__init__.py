"""The loader and mixtures: shuffling, sharding, workers, resume over a store's windows.

``TokenDataset`` (a split's windows, what ``Store.dataset`` returns) lives in
``lmdata.store.dataset``, below this package, and is exported here too. Exports load lazily
(``lmdata.data.make_loader`` imports torch; ``TokenDataset`` does not).
"""

from __future__ import annotations

from lmdata._lazy import lazy_exports

_EXPORTS = {
    "TokenDataset": "lmdata.store.dataset",
    "MixedDataset": "lmdata.data.mixed",
    "Permutation": "lmdata.data.permutation",
    "make_loader": "lmdata.data.loader",
    "TokenLoader": "lmdata.data.loader",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
