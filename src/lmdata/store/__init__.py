"""Token stores: one module per format behind one tiny protocol, a registry, and ``Store``.

``open_store(path)`` is the way in; ``register_format`` adds a format. Names resolve on
first use, so importing this package imports neither pyarrow nor lance.
"""

from __future__ import annotations

from lmdata._lazy import lazy_exports

_EXPORTS = {
    "open_store": "lmdata.store.store",
    "Store": "lmdata.store.store",
    "register_format": "lmdata.store.registry",
    "get_format": "lmdata.store.registry",
    "available_formats": "lmdata.store.registry",
    "verify_store": "lmdata.store.verify",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
