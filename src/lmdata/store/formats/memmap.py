"""The memmap format: raw token arrays, read by the OS page cache with zero decoding.

On disk, per split (``<store>/<split>/memmap/``)::

    tokens-00000.bin   the shard's tokens, raw little-endian uint16 or uint32, no header
                       (the manifest holds dtype and count; size = n_tokens * itemsize)
    docs-00000.npy     int64 [n_docs + 1]: each document's start within the shard, then
                       the shard's length (NumPy .npy, so it is self-describing)
    tokens-00000.bin.crc  CRC-32 of each 4 KiB block of the tokens (store format 2; layout
                       in ``store/blocks.py``), checked on the blocks a read touches (``memmap_blocks.py``)
    _shards/00000.json completion record of the shard (see ``base.py``)

The reader maps each shard lazily (once per process: a memmap is never pickled, and a
forked child maps its own), after checking the shard against the manifest the first time
the process touches it (``verify``: sha256 or size, see ``checksum.verify_shard``), and
copies each window with one contiguous slice; the rare window that straddles a shard
boundary is copied piece by piece.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from lmdata.io import atomic
from lmdata.errors import LmdataError
from lmdata.store.formats import base
from lmdata.store.checksum import DEFAULT_VERIFY, file_info, \
    shard_file_path, verify_shard
from lmdata.store.manifest import FILE_SPEC, Many
from lmdata.store.blocks import SIDECAR_SUFFIX, BlockSums
from lmdata.io.process_local import per_process
from lmdata.store.formats.memmap_blocks import BlockReads
from lmdata.store.protocol import ShardInfo
from lmdata.store.windows import Segments


def _names(index: int) -> tuple[str, str]:
    return f"tokens-{index:05d}.bin", f"docs-{index:05d}.npy"


class MemmapWriter(base.RecordedShardWriter):
    """Writes one raw token file and one doc-offset file per shard."""

    OWNED = re.compile(r"tokens-\d{5}\.bin(\.crc)?|docs-\d{5}\.npy|_shards")

    def write_shard(
        self, index: int, tokens: np.ndarray, doc_starts: np.ndarray, first_doc: int, first_token: int
    ) -> ShardInfo:
        tok_name, doc_name = _names(index)
        tokens, doc_starts = self.shard_arrays(tokens, doc_starts)
        assert doc_starts[-1] == len(tokens), "doc_starts must end with the shard length"
        base.forget(self.format_dir, index)
        replaced = [
            atomic.write_file(self.format_dir / tok_name, tokens.tofile, sync_dir=False, needed=tokens.nbytes),
            atomic.write_file(self.format_dir / doc_name, lambda p: base.save_npy(p, doc_starts), sync_dir=False,
                               needed=doc_starts.nbytes),
            atomic.write_file(self.format_dir / (tok_name + SIDECAR_SUFFIX),
                               lambda p: p.write_bytes(BlockSums.of(tokens).encode()), sync_dir=False),
        ]
        shard = ShardInfo(
            name=f"{index:05d}",
            n_docs=len(doc_starts) - 1,
            n_tokens=len(tokens),
            first_doc=first_doc,
            first_token=first_token,
            files=[file_info(self.format_dir, tok_name), file_info(self.format_dir, doc_name),
                   file_info(self.format_dir, tok_name + SIDECAR_SUFFIX)],
        )
        base.write_record(self.format_dir, index, shard, sync_dirs=[self.format_dir] if any(replaced) else [])
        return shard


class MemmapReader(base.ShardReader):
    """Windows and documents from the raw shards; holds paths only until first use."""

    MANIFEST_SHARD = {"files": Many(FILE_SPEC, 2)}  # tokens-NNNNN.bin, docs-NNNNN.npy

    def __init__(
        self, format_dir: Path, shards: list[ShardInfo], dtype: np.dtype, *, verify: str = DEFAULT_VERIFY
    ) -> None:
        super().__init__(format_dir, shards, dtype, verify=verify)
        self.segments = Segments(self._shard_bounds)
        self.blocks = BlockReads(self.format_dir, self.shards, self.dtype)

    _maps = per_process(lambda self: base.HandleCache())  # open memmaps, bounded (each holds a descriptor)

    def _tokens(self, i: int) -> np.ndarray:
        return self._maps.get(i, self._map)

    def _map(self, i: int) -> np.ndarray:
        """Shard ``i``'s tokens, mapped (checked against the manifest first)."""
        shard = self.shards[i]
        path = shard_file_path(self.format_dir, shard, shard.files[0])
        # with block checksums (store format 2) the blocks a read touches are checked instead
        verify_shard(self.format_dir, shard, "size" if self.blocks.has_sums[i] else self.verify, shard.files[:1])
        size = os.stat(path).st_size
        if size != shard.n_tokens * self.dtype.itemsize:
            raise LmdataError(
                f"{path}: shard {shard.name} has {size} bytes, expected {shard.n_tokens} tokens of "
                f"{self.dtype.name}; the store is damaged (run `lmdata verify`)"
            )
        if shard.n_tokens == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(path, dtype=self.dtype, mode="r", shape=(shard.n_tokens,))

    def _windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        # One contiguous slice per window beats a fancy index here: ~0.1 ms less per batch
        # of 32 x 1,025 (no index array, no per-shard grouping).
        seg = self.segments
        if self.remote:
            return self.blocks.remote_windows(starts, length, seg)
        out = np.empty((len(starts), length), dtype=self.dtype)
        first, last = seg.locate(starts), seg.locate(starts + length - 1)
        local = starts - seg.bounds[first]
        for j, (i, i_last, lo) in enumerate(zip(first.tolist(), last.tolist(), local.tolist())):
            if i == i_last:
                out[j] = self._span(i, lo, lo + length)
            else:  # straddles a shard boundary: copy it piece by piece
                s0 = int(starts[j])
                for k in range(i, i_last + 1):
                    base = int(seg.bounds[k])
                    a, b = max(s0, base), min(s0 + length, int(seg.bounds[k + 1]))
                    out[j, a - s0 : b - s0] = self._span(k, a - base, b - base)
        return out

    def _span(self, i: int, lo: int, hi: int) -> np.ndarray:
        """Tokens ``[lo, hi)`` of local shard ``i``, their blocks verified (once per process)."""
        tokens = self._tokens(i)
        if self.verify != "size":
            self.blocks.check_local(i, tokens, lo, hi)
        return tokens[lo:hi]

    def _document(self, i: int, k: int) -> np.ndarray:
        starts = self.doc_starts(i)
        if self.remote:
            return self.blocks.remote_tokens(i, int(starts[k]), int(starts[k + 1]))
        return np.array(self._span(i, int(starts[k]), int(starts[k + 1])))

    def doc_starts(self, i: int) -> np.ndarray:
        """Shard ``i``'s document starts (within the shard), then its length."""
        shard = self.shards[i]
        path, source = self._small_file(shard, shard.files[1])
        try:
            starts = np.load(source, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise LmdataError(
                f"{path}: shard {shard.name} document index is unreadable ({exc}); run `lmdata verify`"
            ) from exc
        if starts.shape != (shard.n_docs + 1,) or (len(starts) and starts[-1] != shard.n_tokens):
            raise LmdataError(
                f"{path}: shard {shard.name} document index does not match the manifest; run `lmdata verify`"
            )
        return starts

