"""The engine-neutral shard core: cutting encoded documents into shards, prefix reuse, reports.

- Shard cut points depend only on the documents' token counts (a shard closes before the
  document that would take it past ``shard_tokens``; a longer document is a shard alone),
  so output never depends on the engine or the worker count.
- ``resume`` re-reads the documents of shards every format already completed (cheap: no
  tokenizing) and skips them (``reusable_prefix``); later shards are recomputed, so cut
  points match an uninterrupted run. A completed shard is reused only while its files hash to
  its record's checksum (``drop_damaged``; a record vouches for a file's bytes, not just its size).
- Provenance (``lmdata.store.provenance``): an engine that passes each batch's ``origins``
  (``[n_docs, 2]``: source index, offset) to ``ShardCutter.add`` gets each shard's origins
  written before the formats get the shard; ``start_split`` counts the provenance records
  among the formats, so a reused shard always has its origins.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmdata.io.streams import strip_compression
from lmdata.ingest.splits import SplitSource
from lmdata.sources import expand, kind_of
from lmdata.store.layout import PROVENANCE_DIR
from lmdata.store.protocol import FormatWriter, ShardInfo
from lmdata.store.provenance import ProvenanceWriter


@dataclass
class SplitReport:
    """The closing summary of one split (``line()`` is what the CLI prints)."""

    name: str
    documents: int = 0
    tokens: int = 0
    text_bytes: int = 0
    replaced: int = 0
    shards: int = 0
    reused_shards: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        bpt = self.text_bytes / max(1, self.tokens - self.documents)
        rate = self.text_bytes / 1e6 / max(self.seconds, 1e-9)
        s = (
            f"{self.name}: {counted(self.documents, 'document')}, {self.tokens:,} tokens, {bpt:.2f} bytes/token, "
            f"{counted(self.shards, 'shard')}, {self.seconds:.1f} s ({rate:.2f} MB/s)"
        )
        if self.reused_shards:
            s += f" ({counted(self.reused_shards, 'shard')} reused from the earlier run)"
        if self.replaced:
            s += f", {self.replaced:,} invalid UTF-8 sequences replaced by U+FFFD"
        return s


def counted(n: int, noun: str) -> str:
    """``1 shard``, ``2 shards``, ``1,024 documents``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


class ShardCutter:
    """Collects encoded documents and hands complete shards to the writers.

    A writer's ``write_shard`` may return a ``ShardInfo`` or a handle the engine resolves
    later (a Future, a Ray object ref); ``written`` keeps whatever it returned. With a
    ``provenance`` writer every ``add`` must bring its batch's origins. ``join`` makes a shard's
    tokens from its documents' slices of the batches (an engine whose ``tokens`` are references
    to arrays elsewhere joins the references: ``ray_store``).
    """

    join = staticmethod(np.concatenate)

    def __init__(self, writers: dict[str, FormatWriter], done: dict[str, dict[int, ShardInfo]],
                 shard_tokens: int, index: int, first_doc: int, first_token: int,
                 provenance: Any = None) -> None:  # a ProvenanceWriter, or one behind a BackgroundWriter
        self.writers, self.done, self.shard_tokens = writers, done, shard_tokens
        self.index, self.first_doc, self.first_token = index, first_doc, first_token
        self.provenance = provenance
        self.pieces: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []  # this shard's documents' lengths, an array per piece
        self.origins: list[np.ndarray] = []
        self.n = 0
        self.written: dict[str, list[Any]] = {fmt: [] for fmt in writers}
        self.origins_written: list[Any] = []  # what ``provenance.write_shard`` returned (a Future, say)

    def add(self, tokens: np.ndarray, lengths: np.ndarray, origins: np.ndarray | None = None) -> None:
        """The batch's documents, in order: a shard is cut before the first document that would take
        it past ``shard_tokens`` (a document longer than that gets a shard of its own).

        The documents of a batch that go to one shard are one slice of its tokens, found with one
        ``searchsorted`` per shard: a per-document loop cost the main thread ~1 us a document
        and the shard ~1,000 slices to join (~1.5 ms a shard)."""
        if self.provenance is not None and (origins is None or len(origins) != len(lengths)):
            raise RuntimeError("ShardCutter.add: a batch without the origins of each of its documents")
        lengths = np.asarray(lengths, dtype=np.int64)
        ends = np.cumsum(lengths)  # each document's end in the batch's tokens
        p, offset, n_docs = 0, 0, len(lengths)
        while p < n_docs:
            m = int(np.searchsorted(ends, offset + self.shard_tokens - self.n, side="right"))  # p..m-1 fit
            if m <= p:
                if self.n:  # the next document does not fit: cut here
                    self.flush()
                    continue
                m = p + 1
            end = int(ends[m - 1])
            self.pieces.append(tokens[offset:end])
            self.lengths.append(lengths[p:m])
            if origins is not None:
                self.origins.append(origins[p:m])
            self.n += end - offset
            offset, p = end, m
            if p < n_docs:  # document p does not fit (m was the most that did)
                self.flush()

    def flush(self) -> None:
        if not self.n:
            return
        tokens = self.join(self.pieces)
        lengths = np.concatenate(self.lengths)
        doc_starts = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=doc_starts[1:])
        if self.provenance is not None:
            self._write_origins(len(lengths))
        for fmt, writer in self.writers.items():
            have = self.done[fmt].get(self.index)
            if have is not None and (have.n_docs, have.n_tokens, have.first_doc) == (
                len(lengths), self.n, self.first_doc
            ):
                self.written[fmt].append(have)  # finished by the interrupted run
            else:
                self.written[fmt].append(writer.write_shard(self.index, tokens, doc_starts, self.first_doc, self.first_token))
        self.index += 1
        self.first_doc += len(lengths)
        self.first_token += self.n
        self.pieces, self.lengths, self.origins, self.n = [], [], [], 0

    def _write_origins(self, n_docs: int) -> None:
        """This shard's origins (skipped when on disk). Their record need not come first: a shard
        whose origins are not recorded is not in the reusable prefix, so a resume redoes it."""
        have = self.done.get(PROVENANCE_DIR, {}).get(self.index)
        if have is not None and (have.n_docs, have.n_tokens, have.first_doc) == (n_docs, self.n, self.first_doc):
            return  # the interrupted run wrote it (the plan is the same, so are the origins)
        self.origins_written.append(self.provenance.write_shard(self.index, np.concatenate(self.origins), self.n,
                                                                self.first_doc, self.first_token))


def reusable_prefix(done: dict[str, dict[int, ShardInfo]]) -> dict[str, list[ShardInfo]]:
    """Per format, shards 0..k-1 that every format completed with the same counts (else: redo them)."""
    prefix: dict[str, list[ShardInfo]] = {fmt: [] for fmt in done}
    first_doc = first_token = 0
    for index in itertools.count():
        infos = [d.get(index) for d in done.values()]
        if not infos or any(i is None for i in infos):
            break
        key = {(i.n_docs, i.n_tokens, i.first_doc, i.first_token) for i in infos}
        if len(key) != 1 or next(iter(key))[2:] != (first_doc, first_token):
            break
        for fmt, d in done.items():
            prefix[fmt].append(d[index])
        first_doc += infos[0].n_docs
        first_token += infos[0].n_tokens
    return prefix


def start_split(writers: dict[str, FormatWriter], provenance: ProvenanceWriter | None = None,
                ) -> tuple[dict[str, dict[int, ShardInfo]], dict[str, list[ShardInfo]]]:
    """Before a split: (each format's completed shards, the prefix every format can reuse);
    partial files of an interrupted run are removed. With ``provenance``, its records count
    as a format's (key ``PROVENANCE_DIR``, after the formats): a shard without them is redone."""
    tables: dict[str, Any] = {**writers, **({PROVENANCE_DIR: provenance} if provenance is not None else {})}
    done = {fmt: w.completed() for fmt, w in tables.items()}
    for fmt, w in tables.items():  # a resume: what it reuses must still hash to its records (writers with local files)
        if done[fmt] and hasattr(w, "drop_damaged"):
            done[fmt] = w.drop_damaged(done[fmt])
    for w in tables.values():
        w.cleanup_partial()
    return done, reusable_prefix(done)


def progress_bar(name: str, source: SplitSource, show: bool) -> Any:
    """Progress in bytes of input (so it shows MB/s); tokens/s goes in its postfix (``lmdata._progress``)."""
    from lmdata._progress import progress

    return progress(show, desc=f"ingest {name}", unit="B", unit_scale=True, mininterval=0.5,
                    total=_known_size(source) if show else None)


def _known_size(source: SplitSource) -> int | None:
    """Input bytes the progress bar will count, when that is knowable up front."""
    files = expand(source.spec.paths)
    if source.start or source.stop is not None or any(kind_of(f, source.spec.kind) in ("parquet", "arrow") or
                                                        strip_compression(f)[1] for f in files):
        return None
    return sum(f.size() or 0 for f in files)
