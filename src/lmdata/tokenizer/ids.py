"""Token ids as users hand them over: a list, a tuple, a 1-D NumPy array or torch tensor."""

from __future__ import annotations

from typing import Any

from lmdata.errors import LmdataError


def id_list(ids: Any) -> list:
    """``ids`` as a list of Python ints where it holds them (``tolist`` for arrays and tensors: a 2-D one
    stays nested and is named by the caller); a bare number or other non-sequence is one line."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    elif hasattr(ids, "__iter__") and not isinstance(ids, (str, bytes)):
        ids = list(ids)
    if not isinstance(ids, list):
        raise LmdataError(f"not a sequence of token ids: {ids!r}; give a list of ints, or a 1-D array or tensor")
    return ids
