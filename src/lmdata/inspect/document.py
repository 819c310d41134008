"""``lmdata show``: one document of a store decoded back to text."""

from __future__ import annotations

from pathlib import Path

from lmdata.store.store import open_store


def show(store: str | Path, split: str, doc: int, format: str | None = None) -> str:
    """Document ``doc`` of ``split`` decoded back to text (its end-of-text id dropped)."""
    st = open_store(store)
    ids = st.document(split, doc, format)
    if len(ids) and int(ids[-1]) == st.eot_id:
        ids = ids[:-1]
    return st.tokenizer().decode([int(i) for i in ids])
