"""The memmap format: raw token arrays, read by the OS page cache with zero decoding.

On disk, per split (``<store>/<split>/memmap/``)::

    tokens-00000.bin   the shard's tokens, raw little-endian uint16 or uint32, no header
                       (the manifest holds dtype and count; size = n_tokens * itemsize)
    docs-00000.npy     int64 [n_docs + 1]: each document's start within the shard, then
                       the shard's length (NumPy .npy, so it is self-describing)
    tokens-00000.bin.crc  CRC-32 of each 4 KiB block of the tokens (store format 2; layout
                       in ``store/blocks.py``), checked on the blocks a read touches (``memmap_blocks.py``)
    _shards/00000.json completion record of the shard (see ``base.py``)

The reader copies each window with one ``pread`` into the batch, through the process's
bounded pool of descriptors (``raw_windows``), and checks the 4 KiB blocks a read touches
against the sidecar the first time the process reads them (a store without sidecars: the
shard's checksum on first touch, ``checksum.verify_shard``).

On object storage each shard a batch touches is fetched whole, once per machine, into
``$LMDATA_CACHE_DIR/memmap`` (``shard_copies``: one GET checked against the manifest's checksum;
budget ``LMDATA_MEMMAP_CACHE_BYTES``, default 64 GiB) and read like a local shard by every
process there. 12 shards on moto, shuffled B=32 x 1024, 0 workers: 1.9 -> 189 M tok/s at
+0 ms a request, 1.6 -> 222 at +20 ms (bench/README.md, "Peers (remote)"). A split over the
budget, or a budget of 0, is read by coalesced byte ranges (``memmap_blocks``), which fetch
only the blocks a batch needs but pay a request per shard a batch touches, every epoch.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from lmdata.io.cache import fits_on_disk
from lmdata.io.descriptors import descriptors, open_shards
from lmdata.errors import LmdataError
from lmdata.store.formats import base
from lmdata.store.checksum import DEFAULT_VERIFY, inside_store, write_shard_parts, \
    open_shard_file, verify_shard
from lmdata.store.manifest import FILE_SPEC, Many, plain_name
from lmdata.store.npy import int64_array
from lmdata.store.blocks import SIDECAR_SUFFIX, BlockSums
from lmdata.store.formats.raw_windows import RawFile, RawWindows
from lmdata.store.formats.memmap_blocks import BlockReads
from lmdata.store.formats.parquet_cache import DecodedShards, copy_key
from lmdata.store.formats.shard_copies import CopiedShards
from lmdata.store.protocol import ShardInfo
from lmdata.store.windows import Segments


def _names(index: int) -> tuple[str, str]:
    return f"tokens-{index:05d}.bin", f"docs-{index:05d}.npy"


class MemmapWriter(base.RecordedShardWriter):
    """Writes one raw token file and one doc-offset file per shard."""

    OWNED = re.compile(r"tokens-\d{5,}\.bin(\.crc)?|docs-\d{5,}\.npy|_shards")

    def write_shard(
        self, index: int, tokens: np.ndarray, doc_starts: np.ndarray, first_doc: int, first_token: int
    ) -> ShardInfo:
        tok_name, doc_name = _names(index)
        tokens, doc_starts = self.shard_arrays(tokens, doc_starts)
        assert doc_starts[-1] == len(tokens), "doc_starts must end with the shard length"
        base.forget(self.format_dir, index)
        sums = BlockSums.of(tokens).encode()
        written = [write_shard_parts(self.format_dir, name, [data]) for name, data in
                   ((tok_name, tokens), (doc_name, base.npy_bytes(doc_starts)), (tok_name + SIDECAR_SUFFIX, sums))]
        shard = ShardInfo(
            name=f"{index:05d}",
            n_docs=len(doc_starts) - 1,
            n_tokens=len(tokens),
            first_doc=first_doc,
            first_token=first_token,
            files=[info for _, info in written],
        )
        replaced = any(r for r, _ in written)
        base.write_record(self.format_dir, index, shard, sync_dirs=[self.format_dir] if replaced else [])
        return shard


class MemmapReader(CopiedShards, RawWindows, base.ShardReader):
    """Windows and documents from the raw shards; holds paths only until first use."""

    MANIFEST_SHARD = {"files": Many(FILE_SPEC, 2)}  # tokens-NNNNN.bin, docs-NNNNN.npy

    def __init__(
        self, format_dir: Path, shards: list[ShardInfo], dtype: np.dtype, *, verify: str = DEFAULT_VERIFY,
        use_cache: bool = True,
    ) -> None:
        """``use_cache=False``: remote shards are fetched into this process's memory, never read from or
        written to the machine's copies (``lmdata verify``: the store's own bytes, each read once)."""
        super().__init__(format_dir, shards, dtype, verify=verify)
        self.segments = Segments(self._shard_bounds)
        self.blocks = BlockReads(self.format_dir, self.shards, self.dtype)
        self.copies = self._remote_copies() if self.remote else None
        self.cache_bytes = 1 << 30  # fetched shards kept in memory when the machine's copies cannot be written
        if not use_cache:
            self._read_once()

    def _remote_copies(self) -> DecodedShards | None:
        """The machine's copies of remote shards, when the split fits their budget and the disk (see the
        module docstring); None: read by coalesced byte ranges (``memmap_blocks``)."""
        copies, nbytes = DecodedShards.from_env("memmap"), self.n_tokens * self.dtype.itemsize
        if copies is None or nbytes > copies.max_bytes or not fits_on_disk(copies.root, nbytes):
            return None
        return copies

    @property
    def _remakes_lost_files(self) -> bool:  # type: ignore[override]
        return self.copies is not None  # another process may evict a copy: fetch it again

    def _open_tokens(self, i: int) -> RawFile | np.ndarray:
        """Shard ``i``'s token file, opened and its size checked against the manifest (an ``open`` and
        an ``fstat``: a shard's first touch in a process pays them); remote: the machine's copy."""
        if self.copies is not None:
            return self._copied_tokens(i)
        shard = self.shards[i]
        if not self.blocks.has_sums[i]:  # a store without block checksums: the whole shard hashed, once
            verify_shard(self.format_dir, shard, self.verify, shard.files[:1])
        info = shard.files[0]
        if info.bytes != shard.n_tokens * self.dtype.itemsize:
            raise LmdataError(
                f"{self.format_dir}: shard {shard.name} records {info.bytes} bytes, expected {shard.n_tokens} "
                f"tokens of {self.dtype.name}; the store is damaged (run `lmdata verify`)"
            )
        path, _ = open_shard_file(self._dir, shard, info)
        return RawFile(path, info.bytes)

    def _own_files(self) -> bool:
        return self.copies is None  # remote: the machine's copies (``RawWindows._own_files``)

    def _first_touch(self, shards: list[int], sums: bool) -> None:
        """Open local shards met for the first time in one C call (``open_shards``: token file opened
        and sized, sidecar read and its header checked, CRCs copied, without the GIL); here only each
        sidecar's checksum against the manifest. A shard qualifies when its files have plain names in a
        format directory inside the store and the pool does not hold its path yet; anything
        ``open_shards`` could not do is left to ``_open_tokens`` and ``blocks.sums``, which name what
        is wrong. Measured on 1,160 shards, a fresh process: ~36-40 us a shard one by one as batches met
        them, 10 us a shard here at the first batch."""
        if self.copies is not None:
            return super()._first_touch(shards, sums)  # remote: the machine's copies (``shard_copies``)
        if open_shards is None or not inside_store(self._dir):
            return
        pool, sources, sidecars, size = descriptors(), self._sources, self.blocks.sidecars, self._file_bytes()
        held, root = pool.fds, self._dir + os.sep
        todo, paths, sides = [], [], []
        for i in shards:
            info, side = self.shards[i].files[0], sidecars[i]
            if sources[i] is not None or side is None or info.bytes != size[i] or not plain_name(info.path) or \
                    (sums and not plain_name(side.path)):
                continue
            path = root + info.path
            if path not in held:
                todo.append(i)
                paths.append(path)
                sides.append(side if sums else None)
        status, raw, ends = self._open_at_once(todo, paths, [root + side.path for side in sides] if sums else None,
                                               [side.bytes for side in sides] if sums else None)
        opened, files, loaded = [], [], []
        for k, (i, path, st) in enumerate(zip(todo, paths, status)):
            if st != 1:
                opened.append(i)
                files.append(RawFile(path, int(size[i])))
                loaded.append(st == 0 and sums and
                              sides[k].matches(raw[ends[k]:ends[k + 1]]))
        self._opened(opened, files, loaded)

    def _block_sums(self, i: int) -> BlockSums | None:
        return self._copied_sums(i) if self.copies is not None else self.blocks.sums(i)

    def _where(self, i: int) -> str:
        return self.blocks.where(i) + (f" (copy {self._copy_name(i)})" if self.copies is not None else "")

    def _copy_key(self, i: int) -> str:
        info = self.shards[i].files[0]
        return copy_key(info.digest, f"{(self.format_dir / info.path).uri}:{info.bytes}")

    def _fetch(self, i: int) -> np.ndarray:
        """Shard ``i``'s token file, one GET, checked against the manifest's checksum whatever ``verify``
        says: the copy is trusted by every later process on this machine."""
        shard = self.shards[i]
        info, path = shard.files[0], self.format_dir / shard.files[0].path
        raw = path.read_bytes()
        if len(raw) != info.bytes or not info.matches(raw):
            raise LmdataError(f"{path}: shard {shard.name} fails its {info.algo} checksum ({len(raw)} bytes, the "
                              f"manifest says {info.bytes}); run `lmdata verify` and re-ingest with --overwrite")
        return np.frombuffer(raw, dtype=self.dtype)

    def _windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        if self.remote and self.copies is None:
            return self.blocks.remote_windows(starts, length, self.segments)
        return self._raw_windows(starts, length)

    def _document(self, i: int, k: int) -> np.ndarray:
        starts = self.doc_starts(i)
        if self.remote and self.copies is None:
            return self.blocks.remote_tokens(i, int(starts[k]), int(starts[k + 1]))
        return self._raw_span(i, int(starts[k]), int(starts[k + 1]))

    def doc_starts(self, i: int) -> np.ndarray:
        """Shard ``i``'s document starts (within the shard), then its length."""
        shard = self.shards[i]
        path, raw = self._small_file(shard, shard.files[1])
        try:
            starts = int64_array(raw)
        except (OSError, ValueError) as exc:
            raise LmdataError(
                f"{path}: shard {shard.name} document index is unreadable ({exc}); run `lmdata verify`"
            ) from exc
        if starts.shape != (shard.n_docs + 1,) or (len(starts) and starts[-1] != shard.n_tokens):
            raise LmdataError(
                f"{path}: shard {shard.name} document index does not match the manifest; run `lmdata verify`"
            )
        return starts

