"""Block-verified reads of memmap token shards, local or on object storage.

A store of format version 2 writes, beside each ``tokens-NNNNN.bin``, its block checksums
``tokens-NNNNN.bin.crc`` (``blocks.py``: CRC-32 per 4 KiB), the shard's third file in the
manifest. The sidecar is loaded the first time a process touches the shard and checked
against its checksum in the manifest (it is ~1/1000 of the data), so the chain manifest ->
sidecar -> block is sound.

- Local: one ``pread`` serves the window and ``raw_windows`` checks the blocks under it
  the first time this process reads them (with ``sums`` from here), nothing once seen;
  start-up does not grow with the store.
- Remote: ``remote_windows`` turns a batch into byte ranges per shard, which ``RangeFiles``
  coalesces, fetches many at a time and verifies block by block (optionally through the
  local ``ByteCache``); windows are cut from the answers.

A store without sidecars (format version 1) is read as before: a whole-shard checksum the
first time a process touches a shard (``checksum.verify_shard``).
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from lmdata.errors import LmdataError
from lmdata.io.cache import ByteCache
from lmdata.io.location import Location
from lmdata.io.process_local import per_process
from lmdata.io.ranges import FileRef, RangeFiles
from lmdata.store.blocks import SIDECAR_SUFFIX, BlockSums
from lmdata.store.checksum import read_small_file
from lmdata.store.protocol import ShardInfo


def sidecar_info(shard: ShardInfo) -> Any:
    """The shard's checksum sidecar ``FileInfo``, or None (a version-1 store)."""
    return next((f for f in shard.files[2:] if f.path.endswith(SIDECAR_SUFFIX)), None)


class BlockReads:
    """What the memmap reader delegates for sidecar-checked and remote reads (holds paths only)."""

    def __init__(self, format_dir: Location, shards: list[ShardInfo], dtype: np.dtype,
                 cache: ByteCache | None = None) -> None:
        self.format_dir = format_dir
        self.remote = format_dir.remote
        self.shards = shards
        self.itemsize = np.dtype(dtype).itemsize
        self.dtype = np.dtype(dtype)
        self.sidecars = [sidecar_info(s) for s in shards]
        self.has_sums = [info is not None for info in self.sidecars]
        self.cache = cache if cache is not None else (ByteCache.from_env() if self.remote else None)
        self.files = RangeFiles([FileRef(format_dir / s.files[0].path, s.files[0].bytes, name=f"shard {s.name}")
                                 for s in shards], cache=self.cache) if self.remote else None

    _sums = per_process(lambda self: {})  # shard -> BlockSums, each loaded (and checked against the manifest) once

    def _read(self, i: int, info: Any) -> tuple[str, bytes]:
        """(path, bytes) of a small file of shard ``i``: remote one GET; local its size checked and a
        symlink followed only inside the store (``read_small_file``: a reader's creation stats no file,
        so this is where a sidecar linked out of the store, or missing, is named)."""
        if self.remote:
            loc = self.format_dir / info.path
            return str(loc), loc.read_bytes()
        return read_small_file(self._dir, self.shards[i], info, "size")

    def _path(self, info: Any) -> str:
        return str(self.format_dir / info.path) if self.remote else os.path.join(self._dir, info.path)

    _dir = per_process(lambda self: os.fspath(self.format_dir))

    def where(self, i: int) -> str:
        return f"{self.format_dir / self.shards[i].files[0].path}: shard {self.shards[i].name}"

    def sums(self, i: int) -> BlockSums | None:
        """Shard ``i``'s block checksums (loaded and checked against the manifest on first use), or None."""
        if not self.has_sums[i]:
            return None
        cache = self._sums
        sums = cache.get(i)
        if sums is None:
            info = self.sidecars[i]
            path, raw = self._read(i, info)
            if len(raw) != info.bytes or not info.matches(raw):
                raise LmdataError(f"{path}: shard {self.shards[i].name} checksum file fails "
                                  f"its {info.algo}; run `lmdata verify` and re-ingest with --overwrite")
            sums = cache[i] = BlockSums.decode(raw, path)
            if sums.data_bytes != self.shards[i].files[0].bytes:
                raise LmdataError(f"{path}: covers {sums.data_bytes} bytes, the shard has "
                                  f"{self.shards[i].files[0].bytes}; re-ingest with --overwrite")
            if self.files is not None:
                self.files.files[i].check, self.files.files[i].align = sums.check, sums.block_bytes
        return sums

    def load_sums(self, shards: list[int]) -> None:
        """The block checksums of ``shards``: remote, the missing sidecars fetched at once on the range
        reader's threads (a batch of a store of small shards meets ~100: one by one, ~100 requests in turn)."""
        todo = [i for i in shards if self.has_sums[i] and i not in self._sums]
        if self.files is not None and len(todo) > 1:
            list(self.files.pool.map(self.sums, todo))
        else:
            for i in todo:
                self.sums(i)

    def remote_windows(self, starts: np.ndarray, length: int, seg: Any) -> np.ndarray:
        """[len(starts), length] windows read by coalesced, verified byte ranges."""
        first, last = seg.locate(starts), seg.locate(starts + length - 1)
        pieces = []  # (window, out offset, shard, token lo, token hi)
        for j, (i, i_last, s0) in enumerate(zip(first.tolist(), last.tolist(), starts.tolist())):
            for k in range(i, i_last + 1):
                base = int(seg.bounds[k])
                a, b = max(s0, base), min(s0 + length, int(seg.bounds[k + 1]))
                pieces.append((j, a - s0, k, a - base, b - base))
        self.load_sums(sorted({p[2] for p in pieces}))
        assert self.files is not None
        chunks = self.files.read([(k, lo * self.itemsize, hi * self.itemsize) for _, _, k, lo, hi in pieces])
        out = np.empty((len(starts), length), dtype=self.dtype)
        for (j, o, _, lo, hi), data in zip(pieces, chunks):
            out[j, o:o + hi - lo] = np.frombuffer(data, dtype=self.dtype)
        return out

    def remote_tokens(self, i: int, lo: int, hi: int) -> np.ndarray:
        self.sums(i)
        assert self.files is not None
        (data,) = self.files.read([(i, lo * self.itemsize, hi * self.itemsize)])
        return np.frombuffer(data, dtype=self.dtype).copy()

    def load_npy(self, i: int, file_index: int) -> np.ndarray:
        """A small .npy of shard ``i`` (its document offsets) from the store, local or remote."""
        return np.load(io.BytesIO(self._read(i, self.shards[i].files[file_index])[1]), allow_pickle=False)
