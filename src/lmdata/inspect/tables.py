"""The per-document index every inspection reads: one docs batch per shard from a reader's
``doc_starts`` (memmap: docs-*.npy, Lance: its row sidecar, Parquet: its doc_id/token_offset
columns), the store's default format first. Everything here asks the store's readers
(``lmdata.store.protocol``), never a format by name."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from lmdata.errors import LmdataError
from lmdata.store.protocol import ShardInfo
from lmdata.store.registry import get_format
from lmdata.store.store import Store

# ---------------------------------------------------------------------------- per-document index


def _reader_class(fmt: str) -> Any:
    try:
        return get_format(fmt).reader
    except LmdataError:  # a plug-in format that is not installed here
        return None


def formats_with(store: Store, split: str, method: str) -> list[str]:
    """The split's formats whose reader offers ``method``, the store's default format first."""
    present = store.formats(split)
    if not present:
        return []
    order = [store.default_format(split)] + present
    return [f for f in dict.fromkeys(order) if hasattr(_reader_class(f), method)]


def _doc_starts_fn(store: Store, split: str) -> tuple[list[ShardInfo], Callable[[int], np.ndarray]]:
    """A format's shards and, per shard index, its document starts then its length: from
    ``doc_starts`` where a reader has it, else (a plug-in written before it) by measuring each
    document with ``document``."""
    formats = store.manifest.splits[split].formats
    fmts = formats_with(store, split, "doc_starts")
    if fmts:
        return formats[fmts[0]], store.reader(split, fmts[0]).doc_starts
    fmt = next((f for f in store.formats(split) if _reader_class(f) is not None), None)
    if fmt is None:
        raise LmdataError(f"{store.path}: split {split!r} holds no format installed here "
                          f"({', '.join(store.formats(split))}); install its plug-in")
    reader, shards = store.reader(split, fmt), formats[fmt]

    def measured(i: int) -> np.ndarray:
        s = shards[i]
        lengths = [len(reader.document(d)) for d in range(s.first_doc, s.first_doc + s.n_docs)]
        return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)

    return shards, measured


def ingest_shard_docs(shards: list[ShardInfo]) -> np.ndarray:
    """First document of each ingest shard, then the split's document count: the ``shard`` the
    docs view names is the ingest's shard whatever the format (a Lance fragment holds several,
    listed in its ``extra["members"]``)."""
    firsts, doc = [], 0
    for s in shards:
        for m in s.extra.get("members", [{"n_docs": s.n_docs}]):
            firsts.append(doc)
            doc += int(m["n_docs"])
    return np.array(firsts + [doc], dtype=np.int64)


def doc_batches(store: Store, split: str) -> Iterator[Any]:
    """Record batches docs(split, doc_id, shard, n_tokens, token_offset, source, source_offset) of
    one split, a shard at a time; ``source`` (input path or URI) and ``source_offset`` (byte, or
    row of a Parquet/Arrow input) are NULL in a store ingested before lmdata recorded them."""
    import pyarrow as pa

    from lmdata.store.provenance import origins

    if not store.manifest.splits[split].formats:
        return
    shards, starts_of = _doc_starts_fn(store, split)
    shard_docs = ingest_shard_docs(shards)
    where = origins(store, split)
    paths = np.array([str(s["path"]) for s in where.sources], dtype=object)
    for i, shard in enumerate(shards):
        starts = np.asarray(starts_of(i), dtype=np.int64)
        n = len(starts) - 1
        doc_ids = np.arange(shard.first_doc, shard.first_doc + n, dtype=np.int64)
        rows = where.span(shard.first_doc, n)
        if rows is not None and len(rows) and rows[:, 0].max() >= len(paths):
            where.path(int(rows[:, 0].max()))  # one line: the record names a source the manifest lacks
        yield pa.RecordBatch.from_pydict({
            "split": pa.array([split] * n, pa.string()),
            "doc_id": doc_ids,
            "shard": np.searchsorted(shard_docs, doc_ids, side="right") - 1,
            "n_tokens": np.diff(starts),
            "token_offset": starts[:-1] + shard.first_token,
            "source": pa.array(paths[rows[:, 0]] if rows is not None else [None] * n, pa.string()),
            "source_offset": pa.array(rows[:, 1] if rows is not None else [None] * n, pa.int64()),
        }, schema=docs_schema())


def docs_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("split", pa.string()), ("doc_id", pa.int64()), ("shard", pa.int64()),
                      ("n_tokens", pa.int64()), ("token_offset", pa.int64()),
                      ("source", pa.string()), ("source_offset", pa.int64())])


def docs_at(store: Store, split: str) -> Callable[[np.ndarray], np.ndarray]:
    """token offsets -> the documents holding them (one shard's document starts read per shard met)."""
    shards, starts_of = _doc_starts_fn(store, split)
    firsts = np.array([s.first_token for s in shards], dtype=np.int64)
    cache: dict[int, np.ndarray] = {}

    def find(offsets: np.ndarray) -> np.ndarray:
        offsets = np.asarray(offsets, dtype=np.int64)
        out = np.empty(len(offsets), dtype=np.int64)
        for j, t in enumerate(offsets.tolist()):
            i = int(np.searchsorted(firsts, t, side="right") - 1)
            if i not in cache:
                cache[i] = np.asarray(starts_of(i), dtype=np.int64) + shards[i].first_token
            out[j] = shards[i].first_doc + int(np.searchsorted(cache[i], t, side="right") - 1)
        return out

    return find


def doc_table(store: Store, split: str) -> Any:
    """Arrow table docs(split, doc_id, shard, n_tokens, token_offset, source, source_offset) of one split."""
    import pyarrow as pa

    return pa.Table.from_batches(list(doc_batches(store, split)), schema=docs_schema())


# ---------------------------------------------------------------------------- inspect
