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


def _docs_format(store: Store, split: str) -> str | None:
    """The format the per-document index is read from: the first offering ``doc_starts`` (the store's
    default first), else the first installed here; None when none is."""
    fmts = formats_with(store, split, "doc_starts")
    return fmts[0] if fmts else next((f for f in store.formats(split) if _reader_class(f) is not None), None)


def _doc_starts_fn(store: Store, split: str) -> tuple[list[ShardInfo], Callable[[int], np.ndarray]]:
    """A format's shards and, per shard index, its document starts then its length: from
    ``doc_starts`` where a reader has it, else (a plug-in written before it) by measuring each
    document with ``document``."""
    formats, fmt = store.manifest.splits[split].formats, _docs_format(store, split)
    if fmt is None:
        raise LmdataError(f"{store.path}: split {split!r} holds no format installed here "
                          f"({', '.join(store.formats(split))}); install its plug-in")
    reader, shards = store.reader(split, fmt), formats[fmt]
    if hasattr(reader, "doc_starts"):
        return shards, reader.doc_starts

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


BATCH_DOCS = 1 << 16  # documents a docs batch gathers, from as many shards as that takes


def doc_batches(store: Store, split: str) -> Iterator[Any]:
    """Record batches docs(split, doc_id, shard, n_tokens, token_offset, source, source_offset) of
    one split, each from consecutive shards up to ``BATCH_DOCS`` documents; ``source`` (input path or
    URI) and ``source_offset`` (byte, or row of a Parquet/Arrow input) are NULL in a store ingested
    before lmdata recorded them. A batch per shard had cost ~0.3 ms of Arrow calls a shard: 3.5 s
    of ``lmdata inspect``'s 9 s over 11,761 shards."""
    if store.manifest.splits[split].formats:
        yield from SplitDocs(store, split).batches()


class SplitDocs:
    """A split's docs batches, of all its shards or of a range of them (``lmdata sql`` registers the
    split as groups of shards, so that a WHERE on doc_id reads only the group that holds it).
    ``shards``: what ``batches`` indexes, from the manifest (the format ``doc_starts`` will read);
    the reader, every shard's first document and the provenance are made at the first batch, so a
    query that never scans the docs view opens nothing (and a split held only in a plug-in format not
    installed here fails only a scan of it)."""

    def __init__(self, store: Store, split: str) -> None:
        self.store, self.split = store, split
        formats, fmt = store.manifest.splits[split].formats, _docs_format(store, split)
        # no format installed here: the first's shards, for the groups; a scan then says why it cannot read them
        self.shards: list[ShardInfo] = formats[fmt] if fmt is not None else next(iter(formats.values()), [])
        self._shared: tuple[Callable[[int], np.ndarray], np.ndarray, Any, list[str]] | None = None

    def batches(self, shards: range | None = None) -> Iterator[Any]:
        from lmdata.store.provenance import origins

        if self._shared is None:
            _, starts_of = _doc_starts_fn(self.store, self.split)  # the same format's shards
            where = origins(self.store, self.split)
            self._shared = starts_of, ingest_shard_docs(self.shards), where, [str(s["path"]) for s in where.sources]
        starts_of, shard_docs, where, paths = self._shared
        todo = range(len(self.shards)) if shards is None else shards
        group: list[tuple[ShardInfo, np.ndarray, np.ndarray | None]] = []
        n_docs = 0
        for i in todo:
            shard = self.shards[i]
            starts = np.asarray(starts_of(i), dtype=np.int64)
            group.append((shard, starts, where.span(shard.first_doc, len(starts) - 1)))
            n_docs += len(starts) - 1
            if n_docs >= BATCH_DOCS or i == todo[-1]:
                yield _docs_batch(self.split, group, shard_docs, where, paths)
                group, n_docs = [], 0


def _docs_batch(split: str, group: list, shard_docs: np.ndarray, where: Any, paths: list[str]) -> Any:
    """One docs batch of the shards in ``group``: (shard, its document starts, its origins or None);
    ``paths``: the split's sources."""
    import pyarrow as pa

    doc_ids = np.concatenate([np.arange(s.first_doc, s.first_doc + len(st) - 1, dtype=np.int64) for s, st, _ in group])
    n = len(doc_ids)
    if group[0][2] is None:  # a store ingested before provenance was recorded: all of it, or none
        source, offset = pa.nulls(n, pa.string()), pa.nulls(n, pa.int64())
    else:
        rows = np.concatenate([r for _, _, r in group]).reshape(-1, 2)
        if len(rows) and rows[:, 0].max() >= len(paths):
            where.path(int(rows[:, 0].max()))  # one line: the record names a source the manifest lacks
        source = arrow_strings(paths).take(arrow_int64(rows[:, 0]))
        offset = arrow_int64(rows[:, 1])
    return pa.RecordBatch.from_arrays([
        arrow_strings([split]).take(arrow_int64(np.zeros(n, dtype=np.int64))),
        arrow_int64(doc_ids),
        arrow_int64(np.searchsorted(shard_docs, doc_ids, side="right") - 1),
        arrow_int64(np.concatenate([np.diff(st) for _, st, _ in group])),
        arrow_int64(np.concatenate([st[:-1] + s.first_token for s, st, _ in group])),
        source,
        offset,
    ], schema=docs_schema())


# Arrow arrays made from their buffers: ``pa.array`` of a NumPy array or a list first asks whether
# it is a pandas object, which imports pandas (~0.2 s of a `lmdata sql` over the docs view).

def arrow_int64(values: Any) -> Any:
    """An Arrow int64 array of ``values`` (a NumPy array), without pandas."""
    import pyarrow as pa

    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(data), [None, pa.py_buffer(data)])


def arrow_strings(strings: list[str]) -> Any:
    """An Arrow string array of ``strings``, without pandas."""
    import pyarrow as pa

    encoded = [s.encode("utf-8") for s in strings]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def doc_lengths(store: Store, split: str) -> np.ndarray:
    """Every document's token count, in order: the docs view's ``n_tokens`` without its sources (what
    ``lmdata inspect`` needs, in 8 bytes a document instead of the whole docs table)."""
    if not store.manifest.splits[split].formats:
        return np.zeros(0, dtype=np.int64)
    shards, starts_of = _doc_starts_fn(store, split)
    return np.concatenate([np.zeros(0, dtype=np.int64)] +
                          [np.diff(np.asarray(starts_of(i), dtype=np.int64)) for i in range(len(shards))])


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
