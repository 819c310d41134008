"""A Lance split's windows read from raw copies of its ingest shards, decoded once per machine.

A Lance ``take`` has a floor of ~0.36 ms a batch of 32 x 1,025 here, however few rows it returns; a
memmap batch costs a third of that. So, like Parquet's decoded shards (``parquet_cache``), the Lance
reader decodes each ingest shard of a fragment (its ``extra["members"]``, a contiguous run of rows)
once per machine with one take -- every row checked against its CRC-32 and size from the row index,
as every take is -- into ``$LMDATA_CACHE_DIR/lance-tokens`` (budget ``LMDATA_LANCE_CACHE_BYTES``),
and reads windows from those copies like memmap shards (``RawWindows``: positional reads, 4 KiB CRCs
on a process's first read). The Lance dataset stays the store: the copies are keyed by the data
file's checksum and identity (a rewritten file is decoded again), evicted least recently used, and
remade if another process evicts one mid-read. ``LMDATA_LANCE_CACHE_BYTES=0`` reads by takes as
before. On object storage each copy is one remote take of the shard's rows (small shards of a
fragment taken together, up to ``REMOTE_CHUNK_TOKENS``), fetched as a batch first needs it
(``FETCHES`` at a time) and the rest of the split in the background, as remote Parquet and memmap
shards are (``shard_copies``): on moto behind a 20 ms proxy a fresh machine's batches 6-45 read
2.4-6.1x LitData's rate, where a take per batch until a whole copy of the split had arrived read
0.01x (bench/README.md, "Peers (remote)").
Lance itself is imported and the dataset opened only to make a copy: a process whose batches all
meet copies (a later run, a loader worker after the first epoch) never starts Lance's runtime, so
its workers may be forked.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import numpy as np

from lmdata.errors import LmdataError
from lmdata.io.process_local import per_process
from lmdata.store.blocks import BlockSums
from lmdata.store.checksum import stat_shard_file
from lmdata.store.formats import base
from lmdata.store.formats.parquet_cache import DecodedShards, copy_key, file_identity
from lmdata.store.formats.raw_windows import RawFile, RawWindows
from lmdata.store.formats.shard_copies import CopiedShards
from lmdata.store.protocol import ShardInfo

CACHE_KIND = "lance"  # the budget's variable: LMDATA_LANCE_CACHE_BYTES
CACHE_SUBDIR = "lance-tokens"
REMOTE_CHUNK_TOKENS = 4 << 20  # a remote chunk holds at least this many tokens (its fragment's allowing)


def chunks_of(fragments: list[ShardInfo], min_tokens: int = 0) -> tuple[list[ShardInfo], list[tuple[int, int]]]:
    """The ingest shards within each fragment (a fragment without members is one), consecutive ones
    joined until a chunk holds ``min_tokens`` (``00005-00046``), and each chunk's (fragment, first
    token within it)."""
    chunks, home = [], []
    for f, frag in enumerate(fragments):
        members = frag.extra.get("members") or []
        if sum(int(m["n_tokens"]) for m in members) != frag.n_tokens or \
                sum(int(m["n_docs"]) for m in members) != frag.n_docs:
            members = [{"name": frag.name, "n_docs": frag.n_docs, "n_tokens": frag.n_tokens}]
        at = docs = n_tokens = n_docs = 0  # the fragment's tokens and documents before the run; the run's
        run: list[dict] = []
        for k, m in enumerate(members):
            run.append(m)
            n_tokens, n_docs = n_tokens + int(m["n_tokens"]), n_docs + int(m["n_docs"])
            if n_tokens < min_tokens and k + 1 < len(members):
                continue
            name = str(run[0]["name"]) if len(run) == 1 else f"{run[0]['name']}-{run[-1]['name']}"
            chunks.append(ShardInfo(name=name, n_docs=n_docs, n_tokens=n_tokens,
                                    first_doc=frag.first_doc + docs, first_token=frag.first_token + at))
            home.append((f, at))
            at, docs, n_tokens, n_docs, run = at + n_tokens, docs + n_docs, 0, 0, []
    return chunks, home


class LanceChunks(CopiedShards, RawWindows, base.ShardReader):
    """Windows of a Lance split from the machine's decoded copies of its ingest shards."""

    _remakes_lost_files = True  # another process may evict a copy: decode it again

    def __init__(self, lance: Any, copies: DecodedShards) -> None:  # lance: the split's ``LanceReader``
        # remote: a take's request costs the same for 1 or 4 Mi tokens (~20-50 ms on S3; on moto, a read
        # of the whole fragment object), so small ingest shards are fetched in runs of REMOTE_CHUNK_TOKENS
        chunks, self._home = chunks_of(lance.shards, REMOTE_CHUNK_TOKENS if lance.remote else 0)
        super().__init__(lance.format_dir, chunks, lance.dtype, verify=lance.verify)
        # a proxy, not a reference: reader -> chunks -> reader would be a cycle, and the reader (and
        # with it the store's readers' lock, ``readlock``) would live on until a garbage collection
        self.lance, self.copies = weakref.proxy(lance), copies
        self.cache_bytes = 1 << 30  # decoded chunks kept in memory when the copies cannot be written

    @classmethod
    def of(cls, lance: Any) -> "LanceChunks | None":
        """The chunks of a split read through its loader's column; None: read by takes (a column asked
        for, as ``lmdata verify`` does; the budget 0; a remote store written before row CRCs, whose
        rows a take cannot check, and which no copy may then trust). ``use_cache=False``: no copy found or
        made, each chunk taken into memory."""
        if lance.remote and not all(s.extra.get("row_crc") for s in lance.shards):
            return None
        copies = None if lance.column is not None else DecodedShards.from_env(CACHE_KIND, CACHE_SUBDIR)
        if copies is None:
            return None
        chunks = cls(lance, copies)
        if not lance.use_cache:
            chunks._read_once()
        return chunks

    _opening = per_process(lambda self: threading.Lock())
    _real = per_process(lambda self: {})  # fragment -> its data file's real path

    def _copy_key(self, c: int) -> str:
        """The manifest's checksum of the fragment's data file, its identity now (a rewritten file is
        decoded again; the one stat also size-checks it; remote: its URI and size, as ``open_store``'s
        LIST checked) and the chunk's place in it."""
        f, at = self._home[c]
        frag = self.lance.shards[f]
        info = frag.files[0]
        if self.remote:
            return copy_key(info.digest, f"{self.lance._data_path(frag).uri}:{info.bytes}:{at}+{self.shards[c].n_tokens}")
        real = self._real.get(f)
        if real is None:  # resolved inside the store once a fragment (``data/<uuid>.lance``: ~0.2 ms)
            path, st = stat_shard_file(self._dir, frag, info)
            real = self._real[f] = os.path.realpath(path)
        else:
            st = os.stat(real)
            if st.st_size != info.bytes:
                stat_shard_file(self._dir, frag, info)  # the error naming the file and both sizes
        return copy_key(info.digest, f"{file_identity(real, st)}:{at}+{self.shards[c].n_tokens}")

    def _fetch(self, c: int) -> np.ndarray:
        """Chunk ``c``'s tokens: one take of its rows (sizes and CRC-32s checked by ``_take``)."""
        f, at = self._home[c]
        bounds = self.lance._bounds(f)  # global first token of each row, then the fragment's end
        lo = int(self.lance._shard_bounds[f]) + at
        hi = lo + self.shards[c].n_tokens
        r0, r1 = (int(r) for r in np.searchsorted(bounds, [lo, hi]))
        if r1 >= len(bounds) or bounds[r0] != lo or bounds[r1] != hi:
            raise LmdataError(f"{self.lance._data_path(self.lance.shards[f])}: shard {self.shards[c].name} does not "
                              "start and end on rows of its fragment's row index; run `lmdata verify`")
        with self._opening:  # the first fetch opens the dataset, once, whichever thread it runs on
            self.lance._open()
        rows = np.arange(r0, r1, dtype=np.int64) + int(self.lance._row_base[f])
        values, offsets = self.lance._take(rows, np.diff(bounds[r0:r1 + 1]), every=True)
        return np.ascontiguousarray(values[offsets[0]:offsets[-1]], dtype=self.dtype)

    def _open_tokens(self, c: int) -> RawFile | np.ndarray:
        return self._copied_tokens(c)

    def _block_sums(self, c: int) -> BlockSums | None:
        return self._copied_sums(c)

    def _where(self, c: int) -> str:
        frag = self.lance.shards[self._home[c][0]]
        return f"{self.lance._data_path(frag)}: shard {self.shards[c].name} (decoded copy {self._copy_name(c)})"

    def _windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        return self._raw_windows(starts, length)

    def _document(self, i: int, k: int) -> Any:
        raise NotImplementedError  # documents are the Lance reader's (row index + take)

    def doc_starts(self, i: int) -> np.ndarray:
        raise NotImplementedError
