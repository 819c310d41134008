"""Token ids as users hand them over: a list, a tuple, a 1-D NumPy array or torch tensor."""

from __future__ import annotations

from typing import Any

from lmdata._whole import whole
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


def id_bytes(vocab: dict[int, bytes], ids: Any) -> bytes:
    """The bytes of ``ids`` joined.  A float or bool id is refused although the vocab's dict would
    take it (``100.0 == 100``: a float had decoded silently); NumPy ints in a list are ids."""
    ids = id_list(ids)
    try:
        joined = b"".join(map(vocab.__getitem__, ids))
        if set(map(type, ids)) <= {int}:
            return joined
    except (KeyError, TypeError):
        joined = None
    bad = next((i for i in ids if not whole(i) or i not in vocab), None)
    if bad is None:
        return joined
    what = "unknown token id" if whole(bad) else "not a token id (give a flat sequence of ints):"
    gaps = "" if len(vocab) == max(vocab) + 1 else f", {max(vocab) + 1 - len(vocab):,} of them unused"  # (imported)
    raise LmdataError(f"{what} {bad!r}: this tokenizer's ids are 0..{max(vocab)}{gaps}")
