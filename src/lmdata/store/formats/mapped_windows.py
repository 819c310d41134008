"""Windows out of raw token files on local disk: what the memmap reader and the Parquet reader share.

A shard's tokens are one raw little-endian file (memmap's ``tokens-NNNNN.bin``, or a Parquet
shard decoded once into the local cache: ``parquet_cache``). Such files are read here:

- **mapped without a descriptor** (``io.mapped``) on first use in a process, and kept: a
  store of 10,000 shards holds 10,000 mappings and no file descriptors, so ``ulimit -n``
  never limits it; at ``MAX_MAPS`` mappings all are dropped and remapped as touched (~15 us
  each), far above any store's shard count we measured;
- **block-checked once per process**: each 4 KiB block's CRC-32 (``store/blocks.py``) is
  checked the first time this process reads it, with the whole batch's bookkeeping in a
  few NumPy calls (one flat bit per block of the split), so a batch whose blocks were all
  checked costs a gather, not a Python loop per window;
- copied with one contiguous slice per window (a window that straddles two shards, rare,
  piece by piece).

A reader using it implements ``_open_tokens(i)`` (the shard's tokens as an array: usually a
mapping) and ``_block_sums(i)`` (the shard's ``BlockSums``, or None when its bytes were
checked whole at open), and calls ``_mapped_windows`` / ``_mapped_span``.
"""

from __future__ import annotations

import numpy as np

from lmdata.io.mapped import MAX_MAPS
from lmdata.io.process_local import per_process
from lmdata.store.blocks import BLOCK_BYTES, BlockSums
from lmdata.store.windows import concat_ranges


class MappedWindows:
    """Mixin for a ``ShardReader`` whose shards are raw token files (see the module docstring)."""

    _maps = per_process(lambda self: [None] * len(self.shards))  # shard -> its tokens, once opened here
    _n_maps = per_process(lambda self: 0)
    _done = per_process(lambda self: np.zeros(int(self._block_base[-1]), dtype=bool))  # block -> checked here

    def _open_tokens(self, i: int) -> np.ndarray:
        raise NotImplementedError

    def _block_sums(self, i: int) -> BlockSums | None:
        raise NotImplementedError

    def _where(self, i: int) -> str:
        raise NotImplementedError

    @property
    def _block_base(self) -> np.ndarray:
        """Global index of each shard's first block (then the total), for the flat ``_done`` bits."""
        base = self.__dict__.get("_block_base_")
        if base is None:
            nbytes = np.array([s.n_tokens for s in self.shards], dtype=np.int64) * self.dtype.itemsize
            base = self.__dict__["_block_base_"] = np.concatenate([[0], np.cumsum(-(-nbytes // BLOCK_BYTES))])
        return base

    def _tokens(self, i: int) -> np.ndarray:
        tokens = self._maps[i]
        if tokens is None:
            if self._n_maps >= MAX_MAPS:  # drop every mapping; the ones still in use are remapped as touched
                self._maps, self._n_maps = [None] * len(self.shards), 0
            tokens = self._maps[i] = self._open_tokens(i)
            self._n_maps += 1
        return tokens

    def _mapped_windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        bounds = self._shard_bounds
        first = np.searchsorted(bounds, starts, side="right") - 1
        last = np.searchsorted(bounds, starts + (length - 1), side="right") - 1
        local = starts - bounds[first]
        one = first == last
        if self.verify != "size":
            self._check_pieces(first[one], local[one], local[one] + length)
        out = np.empty((len(starts), length), dtype=self.dtype)
        for j, i, lo in zip(np.flatnonzero(one).tolist(), first[one].tolist(), local[one].tolist()):
            out[j] = self._tokens(i)[lo:lo + length]
        for j in np.flatnonzero(~one).tolist():  # straddles a shard boundary: copy it piece by piece
            s0 = int(starts[j])
            for i in range(int(first[j]), int(last[j]) + 1):
                a, b = max(s0, int(bounds[i])), min(s0 + length, int(bounds[i + 1]))
                out[j, a - s0:b - s0] = self._mapped_span(i, a - int(bounds[i]), b - int(bounds[i]))
        return out

    def _mapped_span(self, i: int, lo: int, hi: int) -> np.ndarray:
        """Tokens ``[lo, hi)`` of shard ``i`` (a view of its mapping), their blocks checked."""
        if self.verify != "size" and hi > lo:
            self._check_pieces(np.array([i]), np.array([lo]), np.array([hi]))
        return self._tokens(i)[lo:hi]

    def _check_pieces(self, shard: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Check the blocks under tokens ``[lo, hi)`` of each ``shard`` not yet checked in this process."""
        if not len(shard):
            return
        size = self.dtype.itemsize
        base = self._block_base[shard]
        b0 = base + lo * size // BLOCK_BYTES
        count = (hi * size - 1) // BLOCK_BYTES + 1 + base - b0
        done = self._done
        seen = done[concat_ranges(b0, count)]
        if seen.all():
            return
        whole = np.logical_and.reduceat(seen, np.cumsum(count) - count)
        for k in np.flatnonzero(~whole).tolist():
            self._check_blocks(int(shard[k]), int(b0[k] - base[k]), int(b0[k] - base[k] + count[k]))

    def _check_blocks(self, i: int, a: int, b: int) -> None:
        """Check blocks ``[a, b)`` of shard ``i`` against its recorded CRCs; mark them checked."""
        base, done = int(self._block_base[i]), self._done
        sums = self._block_sums(i)
        if sums is not None:
            if sums.block_bytes != BLOCK_BYTES:  # another block size: check every read, remember nothing
                nbytes = self.shards[i].n_tokens * self.dtype.itemsize
                lo, hi = sums.aligned(a * BLOCK_BYTES, min(b * BLOCK_BYTES, nbytes))
                sums.check(lo, self._tokens(i).view(np.uint8)[lo:hi], self._where(i))
                return
            todo = np.flatnonzero(~done[base + a:base + b])
            if not len(todo):  # checked by an earlier window of the same batch
                return
            a, b = a + int(todo[0]), a + int(todo[-1]) + 1
            raw = self._tokens(i).view(np.uint8)[a * BLOCK_BYTES:b * BLOCK_BYTES]
            sums.check(a * BLOCK_BYTES, raw, self._where(i))
        done[base + a:base + b] = True

    def _forget_checks(self, i: int) -> None:
        """Shard ``i``'s blocks are to be checked again (its file was replaced)."""
        self._done[int(self._block_base[i]):int(self._block_base[i + 1])] = False
        self._maps[i] = None

