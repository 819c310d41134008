"""``lmdata show``: one document of a store decoded back to text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmdata.store.store import Store, open_store


def _opened(store: str | Path | Store) -> Store:
    return store if isinstance(store, Store) else open_store(store)


def show(store: str | Path | Store, split: str, doc: int, format: str | None = None) -> str:
    """Document ``doc`` of ``split`` decoded back to text (its end-of-text id dropped); ``store``: a
    path, or a ``Store`` already open."""
    st = _opened(store)
    ids = st.document(split, doc, format)
    if len(ids) and int(ids[-1]) == st.eot_id:
        ids = ids[:-1]
    return st.tokenizer().decode([int(i) for i in ids])


def describe_origin(where: Any, doc: int) -> str:
    """``PATH, byte N`` (``row N`` for Parquet/Arrow inputs), or that the store does not know."""
    from lmdata.store.provenance import UNKNOWN

    rows = where.span(doc, 1)
    if rows is None:
        return f"source {UNKNOWN}"
    source, offset = rows[0].tolist()
    return f"{where.path(source)}, {where.unit(source)} {offset}"


def source_line(store: str | Path | Store, split: str, doc: int) -> str:
    """One line: where document ``doc`` of ``split`` came from (``lmdata show`` prints it on stderr)."""
    from lmdata.store.provenance import origins

    return f"doc {doc} of {split}: {describe_origin(origins(_opened(store), split), doc)}"
