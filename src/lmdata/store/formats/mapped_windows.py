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
        """Check the blocks under tokens ``[lo, hi)`` of each ``shard`` not yet checked in this process.

        The batch's unchecked blocks are found in a few NumPy calls and then checked shard by
        shard with one CRC call per block: on a 1 G-token store a first-touch window costs a
        4 KiB CRC, not a Python call chain per window (0.12 ms each before, ~7x the read)."""
        if not len(shard):
            return
        size, block_base = self.dtype.itemsize, self._block_base
        base = block_base[shard]
        b0 = base + lo * size // BLOCK_BYTES
        count = (hi * size - 1) // BLOCK_BYTES + 1 + base - b0
        blocks = concat_ranges(b0, count)
        done = self._done
        todo = blocks[~done[blocks]]
        if not len(todo):
            return
        todo = np.unique(todo)
        owner = np.searchsorted(block_base, todo, side="right") - 1
        cuts = np.flatnonzero(np.diff(owner)) + 1
        for run, i in zip(np.split(todo, cuts), owner[np.concatenate([[0], cuts])].tolist()):
            self._check_blocks(i, run - int(block_base[i]))

    def _check_blocks(self, i: int, blocks: np.ndarray) -> None:
        """Check shard ``i``'s blocks ``blocks`` (sorted local indices) against its CRCs; mark them checked."""
        sums = self._block_sums(i)
        if sums is not None:
            raw = self._tokens(i).view(np.uint8)
            if sums.block_bytes != BLOCK_BYTES:  # another block size: check every read, remember nothing
                lo, hi = sums.aligned(int(blocks[0]) * BLOCK_BYTES, min((int(blocks[-1]) + 1) * BLOCK_BYTES, len(raw)))
                sums.check(lo, raw[lo:hi], self._where(i))
                return
            sums.check_blocks(raw, blocks, self._where(i))
        self._done[blocks + int(self._block_base[i])] = True

    def _forget_checks(self, i: int) -> None:
        """Shard ``i``'s blocks are to be checked again (its file was replaced)."""
        self._done[int(self._block_base[i]):int(self._block_base[i + 1])] = False
        self._maps[i] = None

