"""Windows copied out of read-only mappings of a split's raw token files: ``RawWindows``' fast path.

A process's first batch opens the split's shards (``RawWindows._first_touch``, through
``_open_at_once`` here: one ``open_shards`` call); the store's own
are mapped and their descriptors closed again (``_open_and_map``), a decoded copy is mapped through
the pool's descriptor (``_map_opened``), and each batch is one ``io._preads.read_mapped`` call: no
syscall per window, none of the kernel's per-file work that a ``pread`` pays (why, and what a
mapping costs: ``io.mappings``). A shard a batch meets unmapped is mapped then (``_map_batch``);
whatever cannot be mapped (not opened yet, in memory, past the mapping limit,
``LMDATA_MAP_SHARDS=0``) is left to ``RawWindows``' ``pread`` paths, which also name a failed block
or a file cut short.
"""

from __future__ import annotations

import os

import numpy as np

from lmdata.io.descriptors import descriptors, open_shards
from lmdata.io.mappings import Mappings, check_ahead, check_ahead_wait, mapping_on, read_mapped
from lmdata.io.process_local import per_process
from lmdata.store.formats import open_behind
from lmdata.store.windows import sorted_unique

OPEN_TO_MAP = 32  # descriptors a first touch holds at once: below 64, the size a process's table starts at
READ_AHEAD_BYTES = 64 << 20  # windows a reader holds read ahead, at most (the loader's 16 reads of 4 x 32 x 1,025
                             # uint16 ids: 4 MiB); past it, a job only checks the windows' blocks
READ_AHEAD_HANDED = 64  # hand-overs after which windows read ahead and not taken are let go (a pass left early; the
                        # loader takes a read 16 hand-overs after its own at most, a mixture's source fewer)


class MappedWindows:
    """Mixin for ``RawWindows`` (which provides ``_mappable_path`` and the split's block state)."""

    _mapped_opened = per_process(lambda self: False)  # ``_map_opened`` has run here
    _read_ahead = per_process(lambda self: {})  # (starts' bytes, length) -> (out, status, its hand-over's number)
    _handed = per_process(lambda self: 0)  # ``check_ahead`` calls made in this process

    @property
    def _mappings(self) -> Mappings:
        """Each shard's read-only mapping in this process (inherited by a forked worker, not pickled)."""
        maps = self.__dict__.get("_mappings_")
        if maps is None:
            maps = self.__dict__["_mappings_"] = Mappings(len(self.shards))
        return maps

    def _read_mapped(self, starts: np.ndarray, length: int) -> np.ndarray | None:
        """The windows in one C call out of the shards' mappings (``io._preads.read_mapped``), the batch's
        shards mapped first if need be (``_map_batch``); None: the ``pread`` paths below (a shard not
        opened here yet or without its CRCs loaded, in memory, not mappable, or a failed block)."""
        starts = np.ascontiguousarray(starts, dtype=np.int64)
        if self._read_ahead:
            out = self._take_read_ahead(starts, length)
            if out is not None:
                return out
        out = np.empty((len(starts), length), dtype=self.dtype)
        check = self.verify != "size"
        maps = self._mappings
        for attempt in range(2):
            got = read_mapped(starts, length, self.dtype.itemsize, self._bounds64, maps.bases, self._mode,
                              self._file_bytes(), self._block_base, self._done.view(np.uint8), self._crcs, out, check)
            if got != -2 or attempt or not self._map_batch(starts, length, check):
                break
        return out if got == -1 else None

    def _take_read_ahead(self, starts: np.ndarray, length: int) -> np.ndarray | None:
        """The windows ``check_ahead`` had the thread read for these ``starts``, once its job is done; None
        when it was not asked, its job had not started (it is then not run: this thread reads them itself
        while the other goes on to the next job), or it could not read them all (a shard not mapped then,
        a block that failed its CRC, a file cut short: the read does it again itself, and names what
        failed)."""
        got = self._read_ahead.pop((starts.tobytes(), length), None)
        if got is None:
            return None
        out, status, _ = got
        check_ahead_wait(int(status[1]), True)
        return out if status[0] == -1 else None

    def check_ahead(self, starts: np.ndarray, length: int) -> int:
        """Hand the windows a later read will copy to the check-ahead thread (``io._preads.check_ahead``),
        which reads them into a batch of their own (their unchecked blocks checked and marked first) while
        this thread works; the read then takes that batch (``_take_read_ahead``). Returns how many
        unchecked blocks and windows read the jobs finished since the last call met (-1: none finished).
        Only windows whose shards are mapped here with their CRCs loaded (from a process's second read
        on) are read: nothing is opened, mapped or raised, and what the thread could not read, the read
        itself reads and names. While an ``open_behind`` thread opens the split, the windows' shards
        are handed to it first."""
        behind = self._behind
        if behind is not None and len(starts):  # opening the split: these shards first
            shard, _, _ = self._pieces(np.asarray(starts, dtype=np.int64), length)
            if not behind.want(sorted_unique(shard)):
                self._behind = None
        if check_ahead is None or not len(starts) or getattr(self, "_in_memory", 0) or not mapping_on():
            return 0
        starts, held = np.array(starts, dtype=np.int64), self._read_ahead  # (a copy: the job holds it)
        args = (starts, length, self.dtype.itemsize, self._bounds64, self._mappings.bases, self._mode,
                self._file_bytes(), self._block_base, self._done.view(np.uint8), self._crcs)
        self._handed = handed = self._handed + 1
        while held and next(iter(held.values()))[2] < handed - READ_AHEAD_HANDED:
            del held[next(iter(held))]  # never taken (a pass left early), oldest first
        size = len(starts) * length * self.dtype.itemsize
        if sum(out.nbytes for out, _, _ in held.values()) + size > READ_AHEAD_BYTES:  # (reads far larger than the
            return 0 if self.verify == "size" else check_ahead(*args)                # loader's): checked, not read
        out, status = np.empty((len(starts), length), dtype=self.dtype), np.zeros(2, dtype=np.int64)
        found = check_ahead(*args, out, status, self.verify != "size")
        if status[1]:  # handed over (no thread: nothing to take)
            held[(starts.tobytes(), length)] = (out, status, handed)
        return found

    def _open_at_once(self, shards: list[int], paths: list[str], sidecars: list[str] | None,
                      sidecar_bytes: list[int] | None = None) -> tuple[list[int], memoryview, list[int]]:
        """``open_shards`` (one C call, no GIL) over as many of ``shards`` as this thread's pool holds:
        each file at ``paths`` opened and sized (the shards' sizes), and with ``sidecars`` (each
        ``sidecar_bytes`` long) their CRCs put in ``_crcs``. Returns each one's status (0 opened, CRCs
        loaded; 1 not opened; 2 opened, its sidecar not read), the sidecars' bytes and their ends.
        Every descriptor opened is the pool's (the store's own files, mapped, and anything the
        ``open_behind`` thread opens: none is kept, ``_open_and_map``)."""
        own = read_mapped is not None and mapping_on() and (self._own_files() or open_behind.on_thread())
        pool = descriptors()
        n = len(shards) if own else min(len(shards), pool.room())
        shards, paths = shards[:n], paths[:n]
        fds, status = np.full(n, -1, dtype=np.int32), np.ones(n, dtype=np.int8)
        ends = np.zeros(n + 1, dtype=np.int64)
        if sidecars is not None:
            np.cumsum(sidecar_bytes[:n], out=ends[1:])
        raw = np.empty(int(ends[-1]) + 1, dtype=np.uint8)
        if n:
            files = ([os.fsencode(p) for p in paths],
                     [os.fsencode(p) for p in sidecars[:n]] if sidecars is not None else [b""] * n,
                     self._file_bytes()[shards])
            if own:  # mapped and closed again, a few at a time: the pool keeps none of them
                self._open_and_map(np.asarray(shards, dtype=np.int64), *files, fds, raw, ends, status)
                return status.tolist(), memoryview(raw), ends.tolist()
            open_shards(*files, *pool.reserve(n), fds, self._crcs, self._block_base[shards], raw, ends, status)
        got = status.tolist()
        check = self._mappings.files  # (shards mapped before: a copy remade since is another file, ``_same_file``)
        for i, path, fd, st in zip(shards, paths, fds.tolist(), got):
            if st != 1:
                pool.adopt(path, fd)
                if check and i in check:
                    self._same_file(i, fd)
        _, fd_of = self._thread_fds()
        fd_of[np.array(shards, dtype=np.int64)[status != 1]] = fds[status != 1]
        return got, memoryview(raw), ends.tolist()

    def _open_and_map(self, shards: np.ndarray, names: list[bytes], sidecars: list[bytes], sizes: np.ndarray,
                      fds: np.ndarray, raw: np.ndarray, ends: np.ndarray, status: np.ndarray) -> None:
        """``RawWindows._open_at_once`` for the store's own shards, mapped: ``open_shards`` (each file
        opened and sized, its sidecar's CRCs loaded) on ``OPEN_TO_MAP`` at a time, those with their CRCs
        loaded mapped, and every descriptor closed again, so the first touch holds none and the
        process's descriptor table never grows for the store. In a process with threads each growth
        of the table waits for an RCU grace period (7-15 ms here, once per process and per worker: a
        1,160-shard store's first touch went 42-44 -> 30 us a shard). A pread later opens what it
        reads through the pool (``_fd_array``). The arguments are ``open_shards``' (``fds`` and
        ``status`` filled here, ``ends`` the sidecars' offsets in ``raw``)."""
        for a in range(0, len(shards), OPEN_TO_MAP):
            b = min(len(shards), a + OPEN_TO_MAP)
            open_shards(names[a:b], sidecars[a:b], sizes[a:b], 0, b - a, fds[a:b], self._crcs,
                        self._block_base[shards[a:b]], raw, ends[a:b + 1], status[a:b])
            opened, ready = a + np.flatnonzero(status[a:b] != 1), a + np.flatnonzero(status[a:b] == 0)
            try:  # mapped: those with their CRCs loaded (a bad sidecar is named by the pread path)
                maps = self._mappings
                new = ready[maps.bases[shards[ready]] == 0]  # (not a mapping a forked worker inherited)
                maps.map(shards[ready].tolist(), [names[k] for k in ready.tolist()], fds[ready], sizes[ready])
                self._note_files(shards[new], fds[new])  # (a copy: no descriptor kept, which file it was)
            finally:
                for fd in fds[opened].tolist():
                    os.close(fd)

    def _note_files(self, shards: np.ndarray | list[int], fds: np.ndarray) -> None:
        """Which file (device, inode) each copy just mapped here through ``fds`` is, for ``_same_file``.
        The store's own files are never replaced under a reader; a machine's copies may be remade by
        another process, and a descriptor opened by path later (the ``open_behind`` thread keeps none,
        a pool may close its own, a forked worker inherits the mapping but not the pool) may be
        another file than the mapping's."""
        if self._own_files():
            return
        maps = self._mappings
        for i, fd in zip(np.asarray(shards).tolist(), np.asarray(fds).tolist()):
            if fd >= 0 and maps.bases[i]:
                st = os.fstat(fd)
                maps.files[i] = (st.st_dev, st.st_ino)

    def _same_file(self, i: int, fd: int) -> int:
        """``fd``, a descriptor opened by path to read shard ``i`` (``pread``, or a first touch). When the
        shard's mapping is of another file (``_note_files``: a copy remade by another process since),
        the mapping is retired and the shard's blocks are checked again, else a check through ``fd``
        would vouch for the mapping's bytes (a damaged copy, remade, read on from its mapping)."""
        maps = self._mappings
        mapped = maps.files.get(i) if maps.files else None
        if mapped is not None:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != mapped:
                self._let_mapping_go(i)
        return fd

    def _let_mapping_go(self, i: int) -> None:
        """Shard ``i``'s mapping retired and its blocks to be checked again: the marks are cleared once the
        check-ahead jobs already handed over are done (one may be checking the old mapping)."""
        self._mappings.retire(i)
        if check_ahead_wait is not None:
            check_ahead_wait()
        self._read_ahead.clear()  # (read out of the old mapping)
        self._done[int(self._block_base[i]):int(self._block_base[i + 1])] = False

    def _map_batch(self, starts: np.ndarray, length: int, check: bool) -> bool:
        """Map the batch's shards that are not yet, each through this thread's descriptor if it holds
        one; False when one is not opened here yet, has no CRCs loaded (with ``check``), is in memory or
        cannot be mapped."""
        maps = self._mappings
        if self._opened_all and not self._mapped_opened:  # once: every shard the first batch opened, at once
            self._mapped_opened = True
            self._map_opened(check)
        shard, _, _ = self._pieces(starts, length)
        missing = sorted_unique(shard[maps.bases[shard] == 0])
        if not len(missing):
            return False
        paths = [self._mappable_path(i, check) for i in missing.tolist()]
        if None in paths:
            return False
        _, fd_of = self._thread_fds()
        done = maps.map(missing.tolist(), paths, fd_of[missing], self._file_bytes()[missing])
        self._note_files(missing, fd_of[missing])
        return done

    def _map_opened(self, check: bool) -> None:
        """Map every shard opened here (with ``check``, its CRCs loaded) through this thread's descriptors,
        in one call: mapped as batches met them instead, a fresh process's first 1,000 batches of an
        11,761-shard store went through ``_map_batch`` nearly every batch."""
        _, fd_of = self._thread_fds()
        shards, paths = [], []
        for i in np.flatnonzero((fd_of >= 0) & (self._mappings.bases == 0)).tolist():
            path = self._mappable_path(i, check)
            if path is not None:
                shards.append(i)
                paths.append(path)
        if shards:
            self._mappings.map(shards, paths, fd_of[shards], self._file_bytes()[shards])
            self._note_files(shards, fd_of[shards])
