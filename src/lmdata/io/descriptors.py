"""Read-only file descriptors kept for positional reads, bounded by the process's open-file limit.

    fd = descriptors().get("/store/train/memmap/tokens-00000.bin")
    n = os.preadv(fd, [window], offset)      # no file offset: any thread, any order
    preads(fds, offsets, lengths, out)       # a batch's reads in one call (C, GIL released; or None)

Readers of raw token files (memmap shards, Parquet's and Lance's decoded copies) open them here
for their first touch and read with ``pread`` what is not mapped (``io.mappings``: once mapped,
a window is a memcpy, ~0.35 us against ~1.6 us and more for a ``pread`` at 1,000+ files).

The descriptors live in a pool per thread (so none is closed under another thread's read),
oldest closed first when it is full, so the number of shards never meets ``ulimit -n``. The
main thread's pool holds the soft limit less a reserve for everything else (a quarter of it,
at least 1,024 or half a smaller limit), after raising the soft limit towards the hard one
(as Ray and Dask do). A pool of a quarter had thrashed on a 10 B-token store (11,761 shards
under this VM's hard limit of 20,000: a pool of 5,000, and 58 M tok/s against 191 with
every shard held). Descriptors beyond the first 256 are moved above
1024 when the limit allows it, so a library calling ``select()`` on its own new descriptors
never sees one past ``FD_SETSIZE``. A forked child closes the copies it inherited on its
first use of the pool.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from collections import OrderedDict

from lmdata.errors import LmdataError

try:  # one call for a batch's reads, without the GIL (setup.py builds it; optional)
    from lmdata.io import _preads
    from lmdata.io._preads import block_crcs, open_shards, preads, read_batch, read_windows, use_crc32
    span_crcs = getattr(_preads, "span_crcs", None)  # an extension built before it: the rest still used
except ImportError:  # pragma: no cover - installed without a C compiler
    block_crcs = open_shards = preads = read_batch = read_windows = span_crcs = use_crc32 = None


def _isal_crc32() -> int:
    """The address of ISA-L's CRC-32 in the ``isal`` package's extension (0: not there).

    ``read_windows`` checks a first-epoch window's ~6 KiB through it in ~0.9 us, against
    ~3.3 us through zlib's: on a 118 M-token store, the first epoch's rate went from ~0.65x to
    ~1.0x of ``verify="size"``. The C side uses it only if it answers as zlib's does."""
    try:
        import ctypes

        from isal import isal_zlib

        fn = ctypes.CDLL(isal_zlib.__file__).crc32_gzip_refl
    except (ImportError, OSError, AttributeError):
        return 0
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


FAST_CRC32 = bool(use_crc32 is not None and use_crc32(_isal_crc32()))

RAISE_SOFT_TO = 1 << 18  # the soft limit asked for (never above the hard one)
MAX_POOL = 1 << 17  # a 100 B-token store of 1 Mi-token shards, every shard held
_SELECT_LIMIT = 1024  # FD_SETSIZE: descriptors below it are left to everything else...
LOW_DESCRIPTORS = 256  # ...once the pool holds this many (moving one costs two more syscalls)


def main_pool_size(soft: int) -> int:
    """The main thread's pool under a soft limit of ``soft``: what is left after a reserve for the rest
    of the process (sockets, checkpoints, a DataLoader's shared-memory descriptors), a quarter of
    the limit and at least 1,024, or half of a limit below 2,048."""
    reserve = max(soft // 4, min(1024, soft // 2))
    return max(1, min(MAX_POOL, soft - reserve))


def _raise_soft_limit() -> int:
    """The soft open-file limit, first raised towards the hard one (best effort)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = RAISE_SOFT_TO if hard == resource.RLIM_INFINITY else min(hard, RAISE_SOFT_TO)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return RAISE_SOFT_TO if soft == resource.RLIM_INFINITY else soft


_NOATIME = getattr(os, "O_NOATIME", 0)
_noatime_refused: list[bool] = []  # the first EPERM: this process does not own the store's files


def _open_no_atime(path: str, flags: int) -> int:
    """``os.open`` with O_NOATIME while the process may ask for it (its ``pread``s then skip the
    kernel's access-time check: 8-15% of a 2 KB read of a cached page; ``_open_shards.c`` likewise)."""
    if _NOATIME and not _noatime_refused:
        try:
            return os.open(path, flags | _NOATIME)
        except PermissionError as exc:
            if exc.errno != errno.EPERM:
                raise
            _noatime_refused.append(True)  # only a file's owner may; then as any reader
    return os.open(path, flags)


class Descriptors:
    """path -> an open read-only descriptor, at most ``size`` of them (the oldest closed first)."""

    def __init__(self, size: int, floor: int = 0) -> None:
        self.size, self.floor = max(1, size), floor
        self.fds: OrderedDict[str, int] = OrderedDict()
        self.pid = os.getpid()
        self.epoch = 0  # +1 whenever a descriptor is closed: one remembered from an older epoch may be stale
        self.expanded = False  # the process's descriptor table already covers floor + size

    def get(self, path: str, nofollow: bool = False) -> int:
        """``path``'s descriptor, opened if need be (``nofollow``: a symlink raises ``ELOOP``)."""
        fd = self.fds.get(path)
        if fd is None:
            if len(self.fds) >= self.size:
                os.close(self.fds.popitem(last=False)[1])
                self.epoch += 1
            # O_NONBLOCK: a FIFO where a shard should be is opened at once (and refused by its size), not waited on
            fd = self.fds[path] = self._open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK |
                                             (os.O_NOFOLLOW if nofollow else 0))
        return fd

    def _open(self, path: str, flags: int) -> int:
        for attempt in range(2):
            try:
                fd = _open_no_atime(path, flags)
                break
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE) or attempt or not self.fds:
                    if exc.errno in (errno.EMFILE, errno.ENFILE):
                        raise LmdataError(f"{path}: cannot open it, the process has no file descriptor left; "
                                          "raise the open-file limit (ulimit -n)") from None
                    raise
                self.close_half()  # something else took descriptors since the pool was sized
        if len(self.fds) >= LOW_DESCRIPTORS // 4:
            self._grow_table(fd)  # before the table's growth at 256
        if self.floor and fd < self.floor and len(self.fds) >= LOW_DESCRIPTORS:
            try:
                high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, self.floor)
            except OSError:
                return fd
            os.close(fd)
            fd = high
        return fd

    def room(self) -> int:
        """How many more descriptors the pool holds before it closes its oldest."""
        return max(0, self.size - len(self.fds))

    def reserve(self, n: int) -> tuple[int, int]:
        """Ready for ``n`` (<= ``room()``) descriptors opened elsewhere (``open_shards``) and handed in
        by ``adopt``: (the floor to move them to, how many of them may stay below it)."""
        held = len(self.fds)
        assert held + n <= self.size, (held, n, self.size)
        if self.floor and not self.expanded and held + n >= LOW_DESCRIPTORS // 4:
            fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            try:
                self._grow_table(fd)
            finally:
                os.close(fd)
        return self.floor, max(0, LOW_DESCRIPTORS - held) if self.floor else n

    def _grow_table(self, fd: int) -> None:
        """The descriptor table grown at once to the pool's top (``_expand_table``), tried once: a failure
        (no room below the limit) is not retried at every open."""
        if self.floor and not self.expanded:
            _expand_table(fd, self.floor + self.size - 1)
            self.expanded = True

    def adopt(self, path: str, fd: int) -> None:
        """Hold ``fd``, opened on ``path`` after ``reserve`` (``path`` not held yet)."""
        assert path not in self.fds, path
        self.fds[path] = fd

    def forget(self, path: str) -> None:
        """Close ``path``'s descriptor (its file was replaced: the next read opens the new one)."""
        fd = self.fds.pop(path, None)
        if fd is not None:
            os.close(fd)
            self.epoch += 1

    def close_half(self) -> None:
        self.epoch += 1
        for _ in range((len(self.fds) + 1) // 2):
            os.close(self.fds.popitem(last=False)[1])

    def close_all(self) -> None:
        self.epoch += 1
        while self.fds:
            os.close(self.fds.popitem()[1])

    def __del__(self) -> None:
        """A thread's pool goes with its thread: the loader's thread fallback (``ThreadReads``) starts new
        threads every epoch, and each pool's descriptors had stayed open (a sixteenth of the limit a thread,
        every epoch, until the process ran out).  A forked child's copy is the parent's, left alone."""
        try:
            if self.pid == os.getpid():
                self.close_all()
        except Exception:  # at interpreter exit (os gone), or a descriptor closed by someone else
            pass


def _expand_table(fd: int, top: int) -> None:
    """Grow the process's descriptor table to hold descriptor ``top`` at once (a copy of ``fd`` at the
    lowest free number from ``top`` on, closed again; nothing where ``top`` is at or past the limit).

    The kernel grows the table by doubling, and in a process with threads each growth waits for
    an RCU grace period: ~7 ms here, paid at 256, 1024, 2048, ... descriptors as the pool fills
    (two of them, 13 ms, on a 1,160-shard store). One growth to the pool's top, once the pool
    holds 64, pays it once (a store of fewer shards never pays it). Not ``dup2(fd, top)``: another
    thread's pool may hold ``top`` (each pool's top is its floor plus its size, and pools share the
    numbers above the floor), and ``dup2`` would have closed that file under it and put another
    there (threads sharing a reader read wrong windows, or failed on a closed descriptor)."""
    try:
        copy = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, top)
    except OSError:
        return
    os.close(copy)


_local = threading.local()  # one pool per thread: a descriptor is never closed under another thread's read


def descriptors() -> Descriptors:
    """This thread's pool (built on first use; in a forked child, the parent's copies are closed first).

    The main thread's pool takes ``main_pool_size`` of the soft limit, any other thread's a
    sixteenth (the loader's thread fallback reads in a few threads)."""
    pool = getattr(_local, "pool", None)
    if pool is None or pool.pid != os.getpid():
        if pool is not None:
            pool.close_all()  # the inherited copies: the parent's own stay open in the parent
        soft = _raise_soft_limit()
        floor = _SELECT_LIMIT if soft >= 4 * _SELECT_LIMIT else 0
        main = threading.current_thread() is threading.main_thread()
        pool = _local.pool = Descriptors(main_pool_size(soft) if main else min(MAX_POOL, soft // 16), floor)
    return pool


class ShortRead(LmdataError):
    """A file read is shorter than its reader knows it to be (cut short since it was sized)."""


def read_into(path: str, dest: memoryview, offset: int) -> None:
    """Fill ``dest`` from ``path`` at byte ``offset``; a short read (the file shrank) is an error naming it."""
    got = os.preadv(descriptors().get(path), [dest], offset)
    if got != dest.nbytes:
        raise ShortRead(f"{path}: {dest.nbytes} bytes at offset {offset} asked, {got} read: the file is shorter "
                        "than the manifest says; run `lmdata verify`")

