"""Windows out of raw token files on local disk: what the memmap reader and the Parquet reader share.

A shard's tokens are one raw little-endian file (memmap's ``tokens-NNNNN.bin``, or a Parquet
shard decoded once into the local cache: ``parquet_cache``). Such files are read here:

- **mapped without a descriptor** (``io.mapped``) on first use in a process, and kept: a
  store of 10,000 shards holds 10,000 mappings and no file descriptors, so ``ulimit -n``
  never limits it; at ``MAX_MAPS`` mappings all are dropped and remapped as touched (~15 us
  each), far above any store's shard count we measured;
- **block-checked once per process**: each 4 KiB block's CRC-32 (``store/blocks.py``) is
  checked the first time this process reads it. A batch's unchecked blocks are found in a
  few NumPy calls (one flat bit per block of the split) and checked in one flat loop
  against one flat array of expected CRCs (each shard's sidecar copied in when the shard
  is first met), so neither the bookkeeping nor the check grows with the shards a batch
  spans, and a batch whose blocks were all checked costs a gather;
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
from lmdata.store.blocks import BLOCK_BYTES, BlockSums, raw_crc32 as _crc32
from lmdata.store.windows import concat_ranges


class MappedWindows:
    """Mixin for a ``ShardReader`` whose shards are raw token files (see the module docstring)."""

    _maps = per_process(lambda self: [None] * len(self.shards))  # shard -> its tokens, once opened here
    _bytes = per_process(lambda self: [None] * len(self.shards))  # shard -> a byte memoryview of the same
    _n_maps = per_process(lambda self: 0)
    _done = per_process(lambda self: np.zeros(int(self._block_base[-1]), dtype=bool))  # block -> checked here
    # shard -> how its blocks are checked: 0 not known yet, then _FAST / _NONE / _SLOW (see _learn_sums)
    _mode = per_process(lambda self: np.zeros(len(self.shards), dtype=np.int8))
    _crcs = per_process(lambda self: np.zeros(int(self._block_base[-1]), dtype=np.uint32))  # block -> its CRC

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
                self._drop_maps()
            tokens = self._maps[i] = self._open_tokens(i)
            self._bytes[i] = memoryview(tokens.view(np.uint8))
            self._n_maps += 1
        return tokens

    def _drop_maps(self) -> None:
        """Forget every mapping of this process (views still in use keep theirs alive)."""
        self._maps, self._bytes, self._n_maps = [None] * len(self.shards), [None] * len(self.shards), 0

    def _mapped_windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        bounds = self._shard_bounds
        first = np.searchsorted(bounds, starts, side="right") - 1
        last = np.searchsorted(bounds, starts + (length - 1), side="right") - 1
        local = starts - bounds[first]
        one = first == last
        if self.verify != "size":
            self._check_pieces(first[one], local[one], local[one] + length)
        out = np.empty((len(starts), length), dtype=self.dtype)
        maps = self._maps
        for j, i, lo in zip(np.flatnonzero(one).tolist(), first[one].tolist(), local[one].tolist()):
            tokens = maps[i]
            if tokens is None:
                tokens = self._tokens(i)
                maps = self._maps
            out[j] = tokens[lo:lo + length]
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

        The batch's unchecked blocks are found in a few NumPy calls and checked in one flat loop
        of CRC calls against one flat array of expected CRCs: a first-touch block costs its CRC
        (~0.6 us) and ~0.4 us of Python, whatever the number of shards it spans. On a 102-shard
        store this took the first pass of a shuffled epoch from 36 to ~80 M tok/s (``verify="size"``: 85)."""
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
        mode = self._mode
        for i in np.unique(owner[mode[owner] == 0]).tolist():  # shards met for the first time here
            self._learn_sums(i)
        fast = mode[owner] == _FAST
        if not fast.all():
            for i in np.unique(owner[~fast]).tolist():
                self._check_blocks(i, todo[owner == i] - int(block_base[i]))
            todo, owner = todo[fast], owner[fast]
        views, bb = self._bytes, BLOCK_BYTES
        offsets = ((todo - block_base[owner]) * bb).tolist()
        found = np.fromiter((_crc32(views[i][a:a + bb]) for i, a in zip(owner.tolist(), offsets)), np.uint32,
                            len(todo))
        bad = found != self._crcs[todo]
        for i in np.unique(owner[bad]).tolist():  # its own check names the block (or recovers: a stale copy)
            self._check_blocks(i, todo[owner == i] - int(block_base[i]))
        done[todo] = True

    def _learn_sums(self, i: int) -> None:
        """Map shard ``i`` and load its CRCs into the flat array: _FAST (4 KiB blocks, checked in the
        flat loop), _NONE (no CRCs: the bytes were checked whole at open) or _SLOW (another block size)."""
        tokens = self._maps[i]
        if tokens is None:
            self._tokens(i)
        sums = self._block_sums(i)
        if sums is None:
            self._mode[i] = _NONE
        elif sums.block_bytes != BLOCK_BYTES or len(sums.crcs) != self._block_base[i + 1] - self._block_base[i]:
            self._mode[i] = _SLOW
        else:
            self._crcs[int(self._block_base[i]):int(self._block_base[i + 1])] = sums.crcs
            self._mode[i] = _FAST

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
        self._mode[i] = 0
        self._maps[i] = self._bytes[i] = None


_FAST, _NONE, _SLOW = 1, 2, 3
