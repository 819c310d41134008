"""Shards read from whole raw copies in the machine's cache: Parquet's and Lance's decoded shards, remote memmap shards.

A reader using it (with ``RawWindows``) implements ``_fetch(i)`` (shard ``i``'s tokens, its
bytes checked against the manifest) and ``_copy_key(i)`` (``copy_key``: the manifest's checksum
and the identity of the file fetched). The first process on a machine to touch a shard
fetches it and writes the copy (``parquet_cache.DecodedShards``: tmp + rename, sidecar of
block CRCs first); every process then reads the copy like a local memmap shard, its blocks
checked on first read. With the machine's cache off, a fetched shard is kept in the
process's memory instead (up to the reader's ``cache_bytes``).

On object storage a batch of a first epoch meets up to 32 shards no process has fetched:
``_prefetch`` fetches them ``FETCHES`` at a time on threads (a GET and a hash release the
GIL), so a batch waits about one request, not 32 in turn (at 20 ms a request: ~0.65 s).
A shuffled epoch needs every shard within its first ~N/32 batches, so from the first batch
on (when every copy fits the cache's budget and the disk) ``MIRROR_FETCHES`` daemon threads
also fetch the rest of the split in the background (each
process from its own starting shard, so workers and ranks mostly fetch different ones;
whoever needs a shard another thread is fetching waits for it). On a 1,160-shard store of
100,000-token shards behind a 20 ms endpoint the first 220 batches of a fresh machine read
at ~1 M tok/s fetching only what each batch needs: each batch then waits a round of requests.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable

import numpy as np

from lmdata.errors import LmdataError
from lmdata.io import background
from lmdata.io.cache import fits_on_disk
from lmdata.io.descriptors import descriptors, open_shards
from lmdata.io.process_local import per_process
from lmdata.store.blocks import SIDECAR_SUFFIX, BlockSums, sidecar_bytes
from lmdata.store.formats.parquet_cache import DecodedShards
from lmdata.store.formats.raw_windows import _FAST, RawFile

FETCHES = 8  # shards a batch waits for, fetched at once by one process
MIRROR_FETCHES = 4  # shards fetched at once in the background by one process
READ_ONCE_BYTES = 64 << 20  # fetched shards a reader that fills no cache keeps in memory (it reads each once)
USED_EVERY_S = 600.0  # how often a reader marks the copies it reads used (eviction takes the least recently used)


class CopiedShards:
    """Mixin for a ``RawWindows`` reader that reads whole copies of its shards (module docstring)."""

    copies: DecodedShards | None  # the machine's cache of copies (None: off)
    cache_bytes: int  # fetched shards kept in a process's memory when the machine's cache is off

    _in_memory = per_process(lambda self: 0)  # bytes of fetched shards held in this process's memory
    _copy_sums = per_process(lambda self: {})  # shard -> BlockSums of its copy
    _copy_keys = per_process(lambda self: {})  # shard -> the key of the copy this process reads
    _found = per_process(lambda self: {})  # shard -> (key, path) of a copy ``_prefetch`` found, until opened
    _fetcher = per_process(lambda self: ThreadPoolExecutor(FETCHES, thread_name_prefix="lmdata-fetch"))
    _inflight = per_process(lambda self: {})  # shard -> Event set when the thread fetching it is done
    _inflight_lock = per_process(lambda self: threading.Lock())
    _mirroring = per_process(lambda self: False)  # the background fetch of the split has started here
    _kept = per_process(lambda self: {})  # shard -> tokens a batch's prefetch fetched but could not copy

    def _fetch(self, i: int) -> np.ndarray:
        raise NotImplementedError

    def _read_once(self) -> None:
        """``use_cache=False`` (``lmdata verify``): the machine's copies neither found nor made, and at most
        ``READ_ONCE_BYTES`` of fetched shards kept in memory (each shard is read once)."""
        self.cache_bytes = min(self.cache_bytes, READ_ONCE_BYTES)
        if self.copies is not None:
            self.copies.bypassed()

    def _copy_key(self, i: int) -> str:
        raise NotImplementedError

    def _fetched(self, i: int) -> np.ndarray:
        """``_fetch(i)``, which a fork waits for (``io.background``: the child must not inherit an S3 call's locks)."""
        with background.fetching():
            return self._fetch(i)

    def _raw_windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        """As ``RawWindows._raw_windows``, the copies marked used when due (``_mark_used``)."""
        self._mark_used()
        return super()._raw_windows(starts, length)  # type: ignore[misc]

    def _raw_span(self, i: int, lo: int, hi: int) -> np.ndarray:
        """As ``RawWindows._raw_span`` (a document's tokens), the copies marked used when due."""
        self._mark_used()
        return super()._raw_span(i, lo, hi)  # type: ignore[misc]

    _used_due = 0.0

    def _mark_used(self) -> None:
        """Every ``USED_EVERY_S``, mark the copies opened here used. Read through a mapping, a copy is
        otherwise used last when it was opened: a run reading for hours would see another process evict
        the copies it is reading (their inodes live on, mapped here, while the others fetch them again)
        before the ones nobody reads."""
        if self.copies is None or time.monotonic() < self._used_due:
            return
        self._used_due = time.monotonic() + USED_EVERY_S
        for i in list(self._copy_keys):
            source = self._sources[i]
            if isinstance(source, RawFile):
                self.copies.used(source.path)

    def _copied_tokens(self, i: int) -> RawFile | np.ndarray:
        """Shard ``i``'s tokens: the machine's copy, made first when there is none (in memory when the
        machine's cache is off or cannot be written)."""
        tokens = None
        if self.copies is not None:
            key, path = self._found.pop(i, None) or (self._copy_key(i), None)
            self._copy_keys[i] = key
            copy = self._open_copy(i, key, path)
            tokens = self._kept.pop(i, None) if copy is None else None  # fetched by this batch's prefetch
            if copy is None and tokens is None:
                tokens = self._ensure_copy(i, key)
                copy = self._open_copy(i, key) if tokens is None else None
            if copy is not None:
                return copy
        tokens = self._fetched(i) if tokens is None else tokens
        self._copy_sums.pop(i, None)  # checked as it was fetched
        self._in_memory += tokens.nbytes
        if self._in_memory > self.cache_bytes:  # over the budget: forget every fetched shard but this one
            self._drop_sources()
            self._in_memory = tokens.nbytes
        return tokens

    def _open_copy(self, i: int, key: str, path: str | None = None) -> RawFile | None:
        """The machine's copy of shard ``i`` (at ``path`` when ``_prefetch`` just found it), opened, its
        CRCs read with it; None if it has none (or another process evicted it meanwhile)."""
        nbytes = self.shards[i].n_tokens * self.dtype.itemsize
        path = path or self.copies.get(key, self.dtype, nbytes)
        if path is None:
            return None
        pool = descriptors()
        try:
            pool.forget(path)  # a descriptor of an earlier copy at this path is stale
            self._same_file(i, pool.get(path))  # held from now on: another process's eviction cannot take it before the
            #                                     first read (and a mapping made of an earlier copy is let go)
            self._copy_sums[i] = self.copies.sums(path)
        except FileNotFoundError:
            return None
        return RawFile(path, nbytes)

    def _copied_sums(self, i: int) -> BlockSums | None:
        """The CRCs written with the copy (None for a shard fetched into memory: checked as it was read)."""
        sums = self._copy_sums.get(i)
        source = self._sources[i]
        if sums is None and isinstance(source, RawFile):  # opened by ``_first_touch``: read when a check fails
            try:
                sums = self._copy_sums[i] = self.copies.sums(source.path)
            except FileNotFoundError:  # evicted by another process since it was opened
                self._open_again(i)
                return self._copy_sums.get(i)  # None: fetched into memory, checked as it was fetched
        return sums

    def _open_again(self, i: int) -> None:
        """Shard ``i``'s copy gone or dropped: its checks forgotten, and the copy opened again (made
        again, or another process's) with its CRCs, or fetched into memory (checked as it was fetched)."""
        self._copy_sums.pop(i, None)
        self._forget_checks(i)
        self._source(i)

    def _learn_sums(self, i: int) -> None:
        """As ``RawWindows._learn_sums``; a copy's CRCs, once in the flat array, are not kept twice (its
        sidecar is read again should a block fail: ``_copied_sums``)."""
        super()._learn_sums(i)  # type: ignore[misc]
        if self._mode[i] == _FAST:  # type: ignore[attr-defined]
            self._copy_sums.pop(i, None)

    def _first_touch(self, shards: list[int], sums: bool) -> None:
        """Open the machine's copies of ``shards`` that are there, at once (``_open_at_once``: each copy
        opened and sized, its CRCs loaded, in one C call), and mark them used (eviction goes by it). A
        shard whose copy is missing, or whose source the key's ``stat`` refuses, is left to the batch
        that meets it (``_copied_tokens``: made, or the error naming it). 1,160 shards, a fresh process:
        ~55-60 us a shard one by one as batches meet them, 17-20 us a shard here at its first batch."""
        found = self._copy_paths(shards)
        if found is not None:
            for path in self._open_copies(*found, sums):
                self.copies.used(path)

    def _copy_paths(self, shards: Iterable[int]) -> tuple[list[int], list[str], list[str]] | None:
        """The shards of ``shards`` not opened here yet whose copy's key the source's ``stat`` gives, their
        copies' paths and keys (none opened: ``_open_copies``); None when the machine's copies are off."""
        if open_shards is None or self.copies is None or not self.copies.readable:
            return None
        held, sources, path_of, dtype = descriptors().fds, self._sources, self.copies.path_of, self.dtype
        todo, paths, keys = [], [], []
        for i in shards:
            if sources[i] is None:
                try:
                    key = self._copy_key(i)
                except (LmdataError, OSError):
                    continue
                path = path_of(key, dtype)
                if path not in held:
                    todo.append(i)
                    paths.append(path)
                    keys.append(key)
        return todo, paths, keys

    def _open_copies(self, todo: list[int], paths: list[str], keys: list[str], sums: bool) -> list[str]:
        """Open the copies ``_copy_paths`` found (``_open_at_once``); returns the paths opened."""
        size = self._file_bytes()
        status, _, _ = self._open_at_once(todo, paths, [p + SIDECAR_SUFFIX for p in paths] if sums else None,
                                          [sidecar_bytes(int(size[i])) for i in todo] if sums else None)
        opened, files, copy_keys = [], [], self._copy_keys
        for i, path, key, st in zip(todo, paths, keys, status):
            if st == 0:
                copy_keys[i] = key
                opened.append(i)
                files.append(RawFile(path, int(size[i])))
        self._opened(opened, files, [sums] * len(opened))
        return [f.path for f in files]

    def _touch_behind(self, shards: Iterable[int], sums: bool) -> None:
        """The ``open_behind`` thread's first touch: the keys' ``stat`` s and the ``utime`` s outside the
        touch lock, which a batch then waits for only while the copies are opened and mapped (in C)."""
        shards = list(shards)
        found = self._copy_paths(shards) if not self._own_files() else None
        if found is None:  # (its own files, a local memmap store, or no copies to read: the plain touch)
            return super()._touch_behind(shards, sums)  # type: ignore[misc]
        if not found[0]:
            return
        with self._touch_lock.behind():
            keep = [k for k, i in enumerate(found[0]) if self._sources[i] is None]
            opened = self._open_copies(*([x[k] for k in keep] for x in found), sums)
        for path in opened:
            self.copies.used(path)

    def _opens_behind(self) -> bool:
        """A large split's copies open behind the first batch too, mapped (``open_behind``): 11,761
        Parquet copies at the first batch took 0.40 s (a key's ``stat``, a ``utime`` and an open each)."""
        return super()._opens_behind() or (self.copies is not None and self.copies.readable)  # type: ignore[misc]

    def _check_blocks(self, i: int, blocks: np.ndarray) -> None:
        """A block of a copy failing its CRC: the copy is damaged, not the store: drop it and make it
        again, once (a second failure names the block)."""
        try:
            super()._check_blocks(i, blocks)  # type: ignore[misc]
        except LmdataError:
            if self.copies is None:
                raise
            key = self._copy_keys.get(i)
            if key is not None:
                self.copies.drop(self.copies.path(key, self.dtype))
            self._open_again(i)
            super()._check_blocks(i, blocks)  # type: ignore[misc]

    def _copy_name(self, i: int) -> str:
        key = self._copy_keys.get(i)
        return str(self.copies.path(key, self.dtype)) if self.copies and key else "memory"

    def _prefetch(self, shards: Iterable[int]) -> None:
        """Make the machine's copies of ``shards`` that are missing, ``FETCHES`` at a time (remote:
        and start fetching the rest in the background). A failed fetch is raised when the shard is
        opened, naming it."""
        copies = self.copies
        if copies is None or (not copies.writable and (copies.readable or not self.remote)):
            return  # not writable: each batch fetches what it needs, when it needs it (bypassed and remote:
            #        a batch's shards at once, into memory, as ``lmdata verify`` reads them)
        if self.remote and not self._mirroring and copies.writable:
            self._mirroring = True
            if self._split_fits():  # else only what batches need, least recently used evicted
                self._start_mirror()
        sources, found = self._sources, self._found
        todo = []
        for i in dict.fromkeys(shards):
            if sources[i] is None:  # not opened here yet: a copy on the machine needs no thread (~0.2 ms each)
                key = self._copy_key(i)
                path = self.copies.get(key, self.dtype, self.shards[i].n_tokens * self.dtype.itemsize)
                if path is None:
                    todo.append(i)
                else:
                    found[i] = (key, path)  # for ``_copied_tokens``, moments later
        if len(todo) > 1 or (todo and self._mirroring):  # (not writable: fetched into memory, kept for the batch)
            list(self._fetcher.map(functools.partial(self._fetch_once, keep=True), todo))

    def _fetch_once(self, i: int, keep: bool = False) -> None:
        """Make shard ``i``'s copy unless another thread of this process is making it (then wait for
        that one). Errors are left for ``_copied_tokens`` to meet again and raise. ``keep`` (a batch's
        prefetch): tokens whose copy could not be written are kept for the batch, not fetched again."""
        with self._inflight_lock:
            busy = self._inflight.get(i)
            if busy is None:
                self._inflight[i] = threading.Event()
        if busy is not None:
            busy.wait()
            return
        try:
            tokens = self._ensure_copy(i)
            if keep and tokens is not None:
                self._kept[i] = tokens
        except Exception:  # noqa: BLE001 - raised again, naming the shard, when it is opened
            pass
        finally:
            with self._inflight_lock:
                self._inflight.pop(i).set()

    def _ensure_copy(self, i: int, key: str | None = None) -> np.ndarray | None:
        """Make shard ``i``'s copy unless the machine has it (another process making it: wait for that
        one, then use its copy). Returns the fetched tokens when the copy could not be written."""
        key, nbytes = key or self._copy_key(i), self.shards[i].n_tokens * self.dtype.itemsize
        if self.copies.get(key, self.dtype, nbytes) is not None:
            return None
        if not self.copies.writable:  # refused a copy before: the copies that are there, else memory
            return self._fetched(i)
        with self.copies.making(key, self.dtype):
            if self.copies.get(key, self.dtype, nbytes) is not None:
                return None
            tokens = self._fetched(i)
            return None if self.copies.put(key, self.dtype, tokens) is not None else tokens

    def _split_fits(self) -> bool:
        """Every shard's copy fits the cache's budget and leaves the disk its part free (``fits_on_disk``): fetching the
        whole split in the background is worth it only then (it would evict its own copies)."""
        nbytes = sum(s.n_tokens for s in self.shards) * self.dtype.itemsize
        return nbytes <= self.copies.max_bytes and fits_on_disk(self.copies.root, nbytes)

    def _start_mirror(self) -> None:
        """Fetch every shard of the split in the background, ``MIRROR_FETCHES`` at a time, from a
        starting shard of this process's own (``io.background``: daemon threads that stop after the
        shard they are on at exit, and that a fork waits for). The threads hold the reader only while
        they fetch: once it is gone they stop after their current shard (a program making readers of
        a split one after another would otherwise keep every one of them, and four threads each, until
        exit). They stop too once the cache refuses a copy (a full disk, a read-only cache): fetching
        the rest would keep none of it."""
        n = len(self.shards)
        start = os.getpid() * 2654435761 % max(1, n)
        order = iter([(start + k) % n for k in range(n)])
        lock = threading.Lock()
        reader_ref = weakref.ref(self)  # the closure below must not hold the reader

        def run() -> None:
            while not background.stopping():
                with lock:
                    i = next(order, None)
                reader = reader_ref()
                if i is None or reader is None or not reader.copies.writable:
                    return
                fetch = reader._fetch_once if reader._sources[i] is None else None
                del reader
                if fetch is not None:
                    fetch(i)
                    del fetch

        for k in range(MIRROR_FETCHES):
            background.start(f"lmdata-mirror-{k}", run)
