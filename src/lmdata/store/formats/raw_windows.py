"""Windows out of raw token files on local disk: what the memmap reader and the Parquet reader share.

A shard's tokens are one raw little-endian file (memmap's ``tokens-NNNNN.bin``, or a Parquet
shard decoded once into the local cache: ``parquet_cache``), or an array in memory (a
Parquet shard decoded with the machine's cache off). They are read here:

- **opened at once**: a process's first batch opens every shard of a split of up to ``OPEN_AT_ONCE``
  (``_first_touch``: one ``io._preads.open_shards`` call), so no later batch pays a shard's first
  touch; a larger split's batches open the shards each meets, in one such call. A mapped split of
  more than ``open_behind.OPEN_BEHIND_FROM`` shards (the store's own files or a machine's decoded
  copies): the first batch opens its own and a thread the rest (``open_behind``), every first touch
  under ``_touch_lock``;
- **out of mappings**: the first batch's first touch maps every shard read-only and closes its
  descriptor again (``io.mappings``; ``_open_and_map``, then ``_map_batch`` for a shard met later) and
  a batch is one ``io._preads.read_mapped`` call that finds each window's pieces and copies
  them out (~0.35 us a window at any shard count, against ~1.6 us and more at 1,000+ files for
  a ``pread``);
- **with positional reads** for what is not mapped (the first batch, a shard past the mapping
  limit, ``LMDATA_MAP_SHARDS=0``, an install without the C extension): a batch's windows in one
  call (``io._preads.read_batch``, once the batch's shards are open; else ``read_windows`` over
  the pieces ``_pieces`` found: C, the GIL released) through the thread's bounded pool of
  descriptors (each thread its own array of them, ``_thread_fds``), so a store of 10,000 shards
  never meets ``ulimit -n``; a failed block is named, and a lost file named or remade, here;
- **block-checked once per process**: each 4 KiB block's CRC-32 (``store/blocks.py``) is
  checked the first time this process reads it, against one flat array of expected CRCs
  (each shard's sidecar copied in when the shard is first met). In C, a window holding an
  unchecked block reads its block-aligned span once, checks the new blocks and copies the
  window out; the Python path (no compiler, a failed check) finds a batch's unchecked blocks in
  a few NumPy calls, reads each run of consecutive ones in one call and checks them in one flat
  loop, then reads the windows;
- a window that straddles two shards is two pieces of the same call (``_pieces``).

A reader using it implements ``_open_tokens(i)`` (a ``RawFile`` for the shard's tokens, or
an array in memory) and ``_block_sums(i)`` (the shard's ``BlockSums``, or None when its
bytes were checked whole at open), and calls ``_raw_windows`` / ``_raw_span``.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from lmdata.errors import LmdataError
from lmdata.io.descriptors import Descriptors, ShortRead, descriptors, open_shards, preads, read_batch, read_into
from lmdata.io.descriptors import read_windows
from lmdata.io.mappings import mapping_on, read_mapped
from lmdata.io.process_local import per_process
from lmdata.store.blocks import BLOCK_BYTES, BlockSums, raw_crc32 as _crc32
from lmdata.store.formats import open_behind
from lmdata.store.formats.mapped_windows import MappedWindows
from lmdata.store.windows import concat_ranges, sorted_unique


@dataclass(frozen=True)
class RawFile:
    """A shard's tokens as a file of ``nbytes`` raw bytes (its size already checked)."""

    path: str
    nbytes: int


class RawWindows(MappedWindows):
    """Mixin for a ``ShardReader`` whose shards are raw token files (see the module docstring)."""

    _sources = per_process(lambda self: [None] * len(self.shards))  # shard -> RawFile or array, once opened here
    _n_sources = per_process(lambda self: 0)
    _done = per_process(lambda self: np.zeros(int(self._block_base[-1]), dtype=bool))  # block -> checked here
    # shard -> how its blocks are checked: 0 not known yet, then _FAST / _NONE / _SLOW (see _learn_sums)
    _mode = per_process(lambda self: np.zeros(len(self.shards), dtype=np.int8))
    _crcs = per_process(lambda self: np.zeros(int(self._block_base[-1]), dtype=np.uint32))  # block -> its CRC
    # a thread's descriptor pool -> [the pool's epoch it is valid for, shard -> its descriptor there]
    _fds_of = per_process(lambda self: weakref.WeakKeyDictionary())
    _opened_all = per_process(lambda self: False)  # the first batch's ``_first_touch`` of the split is done
    _touch_lock = per_process(lambda self: open_behind.TouchLock())  # held by each ``_touch``
    _behind = per_process(lambda self: None)  # the ``OpenBehind`` started here, if any
    _remakes_lost_files = False  # a file gone between open and read: an error, unless the reader can remake it

    def _open_tokens(self, i: int) -> RawFile | np.ndarray:
        raise NotImplementedError

    def _block_sums(self, i: int) -> BlockSums | None:
        raise NotImplementedError

    def _own_files(self) -> bool:
        """Whether the shards are the store's own files, which no other process replaces while this one
        reads: a first touch then maps them and keeps no descriptor. A machine's decoded copies are not
        (another process may evict or remake one): their descriptors stay in the pool, so a ``pread``
        and the mapping made through it always read the same file."""
        return False

    def _opens_behind(self) -> bool:
        """Whether a large split's shards may be opened on a thread behind the first batch (``open_behind``):
        the store's own files, mapped (the thread keeps no descriptor)."""
        return self._own_files()

    def _where(self, i: int) -> str:
        raise NotImplementedError

    @property
    def _block_base(self) -> np.ndarray:
        """Global index of each shard's first block (then the total), for the flat ``_done`` bits."""
        base = self.__dict__.get("_block_base_")
        if base is None:
            base = self.__dict__["_block_base_"] = np.concatenate([[0], np.cumsum(-(-self._file_bytes() // BLOCK_BYTES))])
        return base

    def _source(self, i: int) -> RawFile | np.ndarray:
        source = self._sources[i]
        if source is None:
            with self._touch_lock:  # (the ``open_behind`` thread may be opening it)
                source = self._sources[i]
                if source is None:
                    source = self._sources[i] = self._open_tokens(i)
                    self._n_sources += 1
        return source

    def _first_touch(self, shards: list[int], sums: bool) -> None:
        """Open, at once, ``shards`` (not opened in this process yet) and, with ``sums``, load their CRCs:
        a reader that can do it in one call does it here (``_opened`` each); what is left is opened one
        by one (``_source``, ``_learn_sums``)."""

    def _touch(self, shards: Iterable[int], sums: bool, behind: bool = False) -> None:
        """``_first_touch`` of those of ``shards`` not opened yet, under this process's ``_touch_lock``
        (a batch's and, ``behind``, the ``open_behind`` thread's: no shard opened twice)."""
        lock = self._touch_lock
        with lock.behind() if behind else lock:
            todo = [i for i in shards if self._sources[i] is None]
            if todo:
                self._first_touch(todo, sums)

    def _touch_behind(self, shards: Iterable[int], sums: bool) -> None:
        """The ``open_behind`` thread's ``_touch`` (``CopiedShards``: what needs no lock first)."""
        self._touch(shards, sums, behind=True)

    def _thread_fds(self) -> tuple[Descriptors, np.ndarray]:
        """This thread's pool and each shard's descriptor in it (-1: none yet), started again whenever
        the pool has closed a descriptor since (its epoch moved). Each thread has its own array: a read
        without the GIL never meets a descriptor another thread's pool may close meanwhile."""
        pool = descriptors()
        entry = self._fds_of.get(pool)
        if entry is None or entry[0] != pool.epoch:
            entry = self._fds_of[pool] = [pool.epoch, np.full(len(self.shards), -1, dtype=np.int32)]
        return pool, entry[1]

    def _opened(self, shards: list[int], files: list[RawFile], crcs_loaded: list[bool]) -> None:
        """``shards`` were opened by ``_first_touch`` (their descriptors in this thread's pool), and
        where ``crcs_loaded`` their 4 KiB CRCs are in ``_crcs`` (checked against the manifest)."""
        sources = self._sources
        for i, source in zip(shards, files):
            sources[i] = source
        self._n_sources += len(shards)
        self._mode[np.array(shards, dtype=np.int64)[np.array(crcs_loaded, dtype=bool)]] = _FAST

    def _drop_sources(self) -> None:
        """Forget every shard opened in this process (in-memory ones are freed when unused)."""
        self._sources, self._n_sources = [None] * len(self.shards), 0

    def _read_pieces(self, shards: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, out: np.ndarray) -> None:
        """Bytes ``[offsets[k], offsets[k] + lengths[k])`` of each shard ``shards[k]``, unchecked, into
        ``out`` one after another (files: one ``preads`` call)."""
        flat = out.reshape(-1).view(np.uint8)
        fds = self._fd_array(shards) if preads is not None else None
        if fds is not None and preads(fds, offsets.astype(np.int64, copy=False),
                                      lengths.astype(np.int64, copy=False), flat) < 0:
            return
        at = 0  # piece by piece: arrays in memory, a short read or a lost file (each named or remade)
        for i, off, n in zip(shards.tolist(), offsets.tolist(), lengths.tolist()):
            self._read_one(i, off, flat[at:at + n])
            at += n

    def _fd_array(self, shards: np.ndarray) -> np.ndarray | None:
        """Each shard's open descriptor, or None when one is no file (or the pool closed one meanwhile)."""
        pool, fd_of = self._thread_fds()
        fds = fd_of[shards]
        if (fds >= 0).all():
            return fds
        epoch = pool.epoch
        missing = sorted_unique(shards[fds < 0]).tolist()
        if self._n_sources < len(self.shards):
            self._touch(missing, sums=False)
        try:
            for i in missing:
                source = self._source(i)
                if source.__class__ is not RawFile:
                    return None
                fd_of[i] = self._same_file(i, pool.get(source.path))
        except FileNotFoundError:
            return None
        if pool.epoch != epoch:  # the pool closed some to open these: ``_thread_fds`` starts again next time
            return None
        return fd_of[shards]

    def _read_one(self, i: int, off: int, dest: np.ndarray) -> None:
        source = self._source(i)
        if source.__class__ is not RawFile:
            dest[:] = source.view(np.uint8)[off:off + len(dest)]
            return
        try:
            self._same_file(i, descriptors().get(source.path))  # (``read_into`` reads through it)
            read_into(source.path, memoryview(dest), off)
        except (FileNotFoundError, ShortRead) as exc:
            if not self._remakes_lost_files:  # (the store's own file: cut short, named by ``read_into``)
                raise exc if isinstance(exc, ShortRead) else LmdataError(
                    f"{self._where(i)}: its file went missing while it was read; run `lmdata verify` and "
                    "re-ingest with --overwrite") from None
            self._forget_checks(i)  # a copy lost or cut short: made again by _open_tokens, and checked again
            if self.verify != "size":
                self._check_spans(np.array([i]), np.array([off]), np.array([off + len(dest)]))
            self._read_one(i, off, dest)

    def _prefetch(self, shards: np.ndarray) -> None:
        """Get ready, all at once, the shards of a batch not opened yet (a reader whose shards are fetched)."""

    def _raw_windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        mappable = read_mapped is not None and len(starts) and not getattr(self, "_in_memory", 0) and mapping_on()
        out = self._read_mapped(starts, length) if mappable else None  # (shards in memory: never mapped)
        if out is not None:
            return out
        out = self._read_batch(starts, length) if read_batch is not None and len(starts) else None
        if out is None and read_batch is not None and open_shards is not None and len(starts):
            out = self._read_past_the_pool(starts, length)
        if out is not None:
            return out
        shard, lows, nbytes = self._pieces(starts, length)
        if self._n_sources < len(self.shards):
            first, self._opened_all = not self._opened_all, True
            behind = first and mappable and self._opens_behind() and len(self.shards) > open_behind.OPEN_BEHIND_FROM
            if first and not behind and len(self.shards) <= OPEN_AT_ONCE:  # the first batch: every shard, at once
                todo = range(len(self.shards))
            else:  # the shards this batch meets, in one call (the rest: behind it, or as later batches meet them)
                todo = [i for i in sorted_unique(shard).tolist() if self._sources[i] is None]
                thread = None if first else self._behind  # (behind the batches: the rest at once, ``overtaken``)
                if todo and thread and len(self.shards) <= OPEN_AT_ONCE and thread.overtaken(len(todo), self._n_sources):
                    todo = [i for i in range(len(self.shards)) if self._sources[i] is None]
                    self._mapped_opened = False  # (the copies among them mapped at once, ``_map_opened``)
            if todo:
                self._touch(todo, sums=self.verify != "size")
            if behind:
                self._behind = open_behind.OpenBehind(self, sums=self.verify != "size")
            mapped = todo and mappable and (self._own_files() or self._behind is not None)  # (copies: mapped now)
            out = self._read_mapped(starts, length) if mapped else None
            if out is not None:
                return out
            self._prefetch(shard)
        out = np.empty((len(starts), length), dtype=self.dtype)
        if read_windows is not None and len(shard) and self._read_in_c(shard, lows, nbytes, out):
            return out
        if self.verify != "size":
            self._check_spans(shard, lows, lows + nbytes)
        self._read_pieces(shard, lows, nbytes, out)
        return out

    def _mappable_path(self, i: int, check: bool) -> bytes | None:
        """Shard ``i``'s path if it is open here as a file (with ``check``, its CRCs loaded): what
        ``MappedWindows`` may map; None for a shard not opened yet, in memory, or without CRCs."""
        source = self._sources[i]
        if source.__class__ is not RawFile or (check and self._mode[i] != _FAST):
            return None
        return os.fsencode(source.path)

    def _read_batch(self, starts: np.ndarray, length: int) -> np.ndarray | None:
        """The windows in one C call that finds their pieces too (``io._preads.read_batch``), once every
        shard they need is open here with its CRCs loaded; None: the path below (it opens, names a
        failed block, or recovers)."""
        _, fd_of = self._thread_fds()
        out = np.empty((len(starts), length), dtype=self.dtype)
        done = read_batch(np.ascontiguousarray(starts), length, self.dtype.itemsize, self._bounds64, fd_of,
                          self._mode, self._file_bytes(), self._block_base, self._done.view(np.uint8), self._crcs, out,
                          self.verify != "size")
        return out if done == -1 else None

    def _read_past_the_pool(self, starts: np.ndarray, length: int) -> np.ndarray | None:
        """A batch of a split with more shards than this thread's pool holds, once the pool is full: the
        shards it holds are looked up, the others opened for this batch alone (``open_shards``: one C
        call, each opened and sized) and closed after its ``read_batch``. The pool keeps what it holds.
        Closing its oldest for each shard met instead (which also restarts every shard's descriptor
        lookup, ``_thread_fds``) read an 11,761-shard store under a limit of 4,096 descriptors at 57
        M tok/s, ~0.3x of every shard held. None: the path below (the pool has room, or a shard is not
        opened in this process yet or has no CRCs loaded)."""
        pool, fd_of = self._thread_fds()
        if pool.room():
            return None
        shard, _, _ = self._pieces(starts, length)
        missing = sorted_unique(shard[fd_of[shard] < 0]).tolist()
        sources, held, mode, check = self._sources, pool.fds, self._mode, self.verify != "size"
        todo, paths = [], []
        for i in missing:
            source = sources[i]
            if source.__class__ is not RawFile or (check and mode[i] != _FAST):
                return None
            fd = held.get(source.path)
            if fd is not None:
                fd_of[i] = fd  # held, and valid while the pool's epoch stands (``_thread_fds``)
                continue
            todo.append(i)
            paths.append(os.fsencode(source.path))
        n = len(todo)
        fds, status = np.full(n, -1, dtype=np.int32), np.ones(n, dtype=np.int8)
        try:
            open_shards(paths, [b""] * n, self._file_bytes()[todo], 0, n, fds, _NO_CRCS, np.zeros(n, dtype=np.int64),
                        _ONE_BYTE, np.zeros(n + 1, dtype=np.int64), status)
            if (status != 0).any():  # gone or resized: the path below names it (or remakes a copy)
                return None
            for i, fd in zip(todo, fds.tolist()):  # (a copy mapped by the ``open_behind`` thread: the same file?)
                self._same_file(i, fd)
            fd_of[todo] = fds
            try:
                return self._read_batch(starts, length)
            finally:
                fd_of[todo] = -1
        finally:
            for fd in fds[fds >= 0].tolist():
                os.close(fd)

    @cached_property
    def _bounds64(self) -> np.ndarray:
        return np.ascontiguousarray(self._shard_bounds, dtype=np.int64)

    def _pieces(self, starts: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(shard, byte offset, byte length) of each piece of the windows, in order: one piece per
        window, two for one across a shard boundary (~1 window in 100 at 100,000-token shards),
        so the pieces end to end are the windows. Empty pieces (an empty shard) are left out."""
        bounds, size = self._shard_bounds, self.dtype.itemsize
        first = np.searchsorted(bounds, starts, side="right") - 1
        last = np.searchsorted(bounds, starts + (length - 1), side="right") - 1
        if (first == last).all():
            return first, (starts - bounds[first]) * size, np.full(len(first), length * size, dtype=np.int64)
        spans = last - first + 1
        window = np.repeat(np.arange(len(starts)), spans)
        shard = first[window] + (np.arange(len(window)) - np.repeat(np.cumsum(spans) - spans, spans))
        a = np.maximum(starts[window], bounds[shard])
        z = np.minimum(starts[window] + length, bounds[shard + 1])
        keep = z > a
        shard, a, z = shard[keep], a[keep], z[keep]
        return shard, (a - bounds[shard]) * size, (z - a) * size

    def _read_in_c(self, shards: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray, out: np.ndarray) -> bool:
        """The pieces (4 KiB CRCs) in one C call: each read, its new blocks checked first
        (``io._preads.read_windows``). False: the Python path reads them (and names a failed block,
        or recovers)."""
        check = self.verify != "size"
        if check:
            mode = self._mode
            new = mode[shards] == 0
            if new.any():
                met = sorted_unique(shards[new]).tolist()
                self._touch(met, sums=True)
                for i in met:
                    if mode[i] == 0:
                        self._learn_sums(i)
            if not (mode[shards] == _FAST).all():
                return False
        fds = self._fd_array(shards)
        if fds is None:
            return False
        failed = read_windows(fds, offsets.astype(np.int64, copy=False), nbytes.astype(np.int64, copy=False),
                              self._file_bytes()[shards], self._block_base[shards], self._done.view(np.uint8),
                              self._crcs, out, check)
        return failed < 0

    def _raw_span(self, i: int, lo: int, hi: int) -> np.ndarray:
        """Tokens ``[lo, hi)`` of shard ``i``, their blocks checked."""
        out = np.empty(max(0, hi - lo), dtype=self.dtype)
        if len(out):
            at, n = np.array([i]), np.array([lo * self.dtype.itemsize])
            if self.verify != "size":
                self._check_spans(at, n, n + out.nbytes)
            self._read_pieces(at, n, np.array([out.nbytes]), out)
        return out

    def _check_spans(self, shard: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Check the blocks under bytes ``[lo, hi)`` of each ``shard`` not yet checked in this process.

        The batch's unchecked blocks are found in a few NumPy calls, each run of consecutive ones
        read in one ``_read_pieces`` call, and every block checked in one flat loop against one
        flat array of expected CRCs, whatever the number of shards the batch spans."""
        if not len(shard):
            return
        block_base = self._block_base
        base = block_base[shard]
        b0 = base + lo // BLOCK_BYTES
        count = (hi - 1) // BLOCK_BYTES + 1 + base - b0
        done = self._done
        todo = _blocks(b0, count)
        todo = todo[~done[todo]]
        if not len(todo):
            return
        todo = sorted_unique(todo)
        owner = np.searchsorted(block_base, todo, side="right") - 1
        mode = self._mode
        new = mode[owner] == 0
        if new.any():
            for i in sorted_unique(owner[new]).tolist():  # shards met for the first time here
                self._learn_sums(i)
        fast = mode[owner] == _FAST
        if not fast.all():
            for i in sorted_unique(owner[~fast]).tolist():
                self._check_blocks(i, todo[owner == i] - int(block_base[i]))
            todo, owner = todo[fast], owner[fast]
        bad = self._bad_blocks(todo, owner)
        if bad.any():
            for i in sorted_unique(owner[bad]).tolist():  # its own check names the block (or recovers: a stale copy)
                self._check_blocks(i, todo[owner == i] - int(block_base[i]))
        done[todo] = True

    def _bad_blocks(self, todo: np.ndarray, owner: np.ndarray) -> np.ndarray:
        """Whether each of ``todo`` (sorted global blocks of the shards ``owner``) fails its CRC."""
        if not len(todo):
            return np.zeros(0, dtype=bool)
        bb = BLOCK_BYTES
        file_end = self._file_bytes()[owner]  # each block's shard size in bytes
        local = (todo - self._block_base[owner]) * bb
        sizes = np.minimum(bb, file_end - local)
        starts_run = np.empty(len(todo), dtype=bool)  # a run: consecutive blocks of one shard
        starts_run[0] = True
        starts_run[1:] = (todo[1:] != todo[:-1] + 1) | (owner[1:] != owner[:-1])
        run = np.flatnonzero(starts_run)
        run_bytes = np.add.reduceat(sizes, run)
        scratch = np.empty(int(run_bytes.sum()), dtype=np.uint8)
        self._read_pieces(owner[run], local[run], run_bytes, scratch)
        at = np.cumsum(sizes) - sizes
        view = memoryview(scratch)
        found = np.fromiter((_crc32(view[a:a + n]) for a, n in zip(at.tolist(), sizes.tolist())), np.uint32,
                            len(todo))
        return found != self._crcs[todo]

    def _file_bytes(self) -> np.ndarray:
        """Each shard's size in bytes."""
        sizes = self.__dict__.get("_file_bytes_")
        if sizes is None:
            sizes = self.__dict__["_file_bytes_"] = np.array([s.n_tokens for s in self.shards],
                                                             dtype=np.int64) * self.dtype.itemsize
        return sizes

    def _learn_sums(self, i: int) -> None:
        """Open shard ``i`` and load its CRCs into the flat array: _FAST (4 KiB blocks, checked in the
        flat loop), _NONE (no CRCs: the bytes were checked whole at open) or _SLOW (another block size)."""
        self._source(i)
        sums = self._block_sums(i)
        if sums is None:
            self._mode[i] = _NONE
        elif sums.block_bytes != BLOCK_BYTES or len(sums.crcs) != self._block_base[i + 1] - self._block_base[i]:
            self._mode[i] = _SLOW
        else:
            self._crcs[int(self._block_base[i]):int(self._block_base[i + 1])] = sums.crcs
            self._mode[i] = _FAST

    def _check_blocks(self, i: int, blocks: np.ndarray) -> None:
        """Check shard ``i``'s blocks ``blocks`` (sorted local indices) against its CRCs; mark them checked
        (another block size: the blocks are checked, nothing is remembered)."""
        sums = self._block_sums(i)
        if sums is not None:
            raw = np.empty(sums.data_bytes, dtype=np.uint8)
            self._read_pieces(np.array([i]), np.array([0]), np.array([sums.data_bytes]), raw)
            if sums.block_bytes != BLOCK_BYTES:
                lo, hi = sums.aligned(int(blocks[0]) * BLOCK_BYTES, min((int(blocks[-1]) + 1) * BLOCK_BYTES, len(raw)))
                sums.check(lo, raw[lo:hi], self._where(i))
                return
            sums.check_blocks(raw, blocks, self._where(i))
        self._done[blocks + int(self._block_base[i])] = True

    def _forget_checks(self, i: int) -> None:
        """Shard ``i``'s blocks are to be checked again (its file was replaced). First the shard is taken
        from the check-ahead thread's reach (no CRCs, no mapping: a job handed over after this skips it),
        then the jobs already handed over finish (one may be checking the old mapping and would mark its
        blocks), and only then are the marks cleared."""
        self._mode[i] = 0
        self._let_mapping_go(i)
        source, self._sources[i] = self._sources[i], None
        self._n_sources -= source is not None  # (batches open it again in their one call)
        if isinstance(source, RawFile):
            descriptors().forget(source.path)


_FAST, _NONE, _SLOW = 1, 2, 3
_NO_CRCS, _ONE_BYTE = np.empty(0, dtype=np.uint32), np.empty(1, dtype=np.uint8)  # open_shards without sidecars
# A process's first batch opens every shard of a split of up to this many at once (``_first_touch``:
# ~10 us a shard in one C call, against ~30-40 each one by one): an 11,761-shard store's first epoch
# read at 159 M tok/s so, against 113 when only the first 4,096 were (the rest one by one). A larger
# split's shards are opened as batches meet them, each batch's in one call: all at once, a 100,010-shard
# store's first batch took 2.0 s.
OPEN_AT_ONCE = 1 << 14


def _blocks(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Every block ``first[k] .. first[k] + count[k] - 1`` (in no particular order): a window's span
    is one or two blocks, so this is two NumPy calls, not ``concat_ranges``' five."""
    widest = int(count.max())
    if widest == 1:
        return first
    if widest == 2:
        return np.concatenate([first, first[count == 2] + 1])
    return concat_ranges(first, count)

