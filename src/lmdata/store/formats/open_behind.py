"""A large split's shards opened on a thread of their own while the first batches are read.

Opening a shard (``RawWindows._first_touch``: file opened and sized, its CRCs loaded, mapped, the
descriptor closed) costs ~30 us. All at once at the first batch, 11,761 shards delayed it by
0.37 s (a fresh process's first batch 1.62-1.76 s against LitData's 1.57); one batch at a time as
batches meet them, the first epoch's next 200 batches read at 16-20 M tok/s against 149. Here the
first batch opens only its own shards and a daemon thread opens the rest, ``CHUNK`` at a time
(C calls without the GIL for most of it), while the process reads, trains, or waits on its
accelerator: what it costs is no longer in front of anything.

The store's own local files and a machine's decoded copies (Parquet's, Lance's, a remote store's)
are opened this way (``RawWindows._opens_behind``), mapped, and only up to the process's mapping
limit. The thread keeps no descriptor (``on_thread``): each file is mapped and its descriptor closed
again, a copy too, whose mapping then holds the file the batches read (another process evicting or
remaking the copy does not change it under them; a copy whose block fails its CRC is retired,
mapping and all, and opened again: ``RawWindows._forget_checks``; a ``pread`` of such a copy, which
opens it by path, first checks it is the file mapped, by device and inode: another, the copy remade
since, retires the mapping, else a check passed on the new file would vouch for the old mapping's
bytes: ``MappedWindows._same_file``). A copy the machine does not have
yet is left to the batch that meets it (made, or fetched). A copy's key (a ``stat`` of its source) and
its ``utime`` take the thread ~20 us a copy of Python and are done outside the lock
(``CopiedShards._touch_behind``): a batch waits only while a chunk is opened and mapped in C.
Each chunk and each batch's own first touch take the reader's ``_touch_lock``, so no shard is
opened twice; a batch that meets a shard the thread has not reached opens it itself.
The 0-worker loader's look-ahead (``data/ahead.py``) hands the thread the next batches' shards
through ``check_ahead``, which it opens before going on in order. Batches that read about as fast
as the thread opens (a loop reading flat out) overtake it: a batch opens the rest at once and the
thread ends (``OpenBehind.overtaken``), so such a loop's first 1,200 batches cost within ~0.06 s
of what they cost with the split opened at its first batch.
The thread holds only a weak reference between chunks (a reader let go stops it) and gives up at
the first error: the batch that meets a damaged shard names it, as without the thread. Each chunk
runs inside ``io.background.fetching()``: a fork waits for it, and the process's exit lets it end.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from typing import Any

import numpy as np

from lmdata.io import background
from lmdata.io.mappings import mapping_room

OPEN_BEHIND_FROM = 4096  # splits of more shards open behind the first batch (fewer: all at once, < ~0.1 s)
CHUNK = 32  # shards a chunk (~1 ms): the longest a batch, or a wanted shard, waits for the thread
OVERTAKEN_FROM = 256  # the batches opened more than this many, and over half what the thread did: the rest at once


THREAD = "lmdata-open-behind"
OS_NAME = b"lmdata-behind"  # the thread's name for the kernel (15 bytes at most): seen from other processes


def opening() -> bool:
    """Whether a reader of this process is still opening its split behind its first batch (a process
    above it looks for the thread's ``OS_NAME``: ``lmdata bench``'s warm-up, for its workers)."""
    return any(t.name == THREAD and t.is_alive() for t in threading.enumerate())


def on_thread() -> bool:
    """Whether this is an ``OpenBehind`` thread: what it opens it maps and closes again, a decoded copy
    too (``MappedWindows._open_at_once``). Its own descriptor pool is no reading thread's: a copy's
    descriptor kept there would serve no read, and the mapping holds the file the batches read."""
    return threading.current_thread().name == THREAD


def _name_for_the_kernel() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, OS_NAME, 0, 0, 0)  # PR_SET_NAME: this thread
    except (OSError, AttributeError):
        pass


class TouchLock:
    """The lock of a reader's first touches. The thread gives way to a batch waiting for it: a plain
    lock let it take the lock back chunk after chunk while the batch waited (a second batch stalled
    130-400 ms, until the thread was done)."""

    def __init__(self) -> None:
        self.lock, self.waiting = threading.RLock(), 0

    def __enter__(self) -> None:
        self.waiting += 1  # (a hint: a lost update costs the thread one short wait, or a batch one chunk)
        self.lock.acquire()
        self.waiting = max(0, self.waiting - 1)

    def __exit__(self, *exc: object) -> None:
        self.lock.release()

    def behind(self) -> threading.RLock:
        """The lock for the thread, once no batch waits for it."""
        for _ in range(1000):
            if not self.waiting:
                break
            time.sleep(0.0002)
        return self.lock


class OpenBehind:
    """The thread opening a reader's shards, and the shards wanted first (a later batch's, handed
    over by the 0-worker loader's look-ahead through ``check_ahead``)."""

    def __init__(self, reader: Any, sums: bool) -> None:
        self.wanted: deque[np.ndarray] = deque()
        self.by_batches = 0  # shards the batches opened themselves since the first
        ref, n = weakref.ref(reader), len(reader.shards)
        self.thread = background.start(THREAD, lambda: _open_rest(ref, n, sums, self.wanted))

    def overtaken(self, n: int, opened: int) -> bool:
        """A batch opens ``n`` shards itself (``opened`` of the split are open): whether the batches have
        now opened more than half as many as the thread, past ``OVERTAKEN_FROM``. They then read about
        as fast as it opens (a loop reading flat out, the GIL shared with the thread: at 11,761 shards
        the batches had opened 297 and the thread 316 by the 10th batch; with a 2 ms step between
        batches 287 against 788), and the batch opens the rest at once instead, as the first batch of a
        smaller split does: flat out, 11,761 Parquet copies opened behind had cost the first ~1,000
        batches 0.2-1.0 s more in all than opening them at once."""
        self.by_batches += n
        return self.by_batches > OVERTAKEN_FROM and 2 * self.by_batches > opened - self.by_batches

    def want(self, shards: np.ndarray) -> bool:
        """Open ``shards`` next; False once the thread is done (nothing is queued)."""
        if not self.thread.is_alive():
            return False
        for a in range(0, len(shards), CHUNK):  # a chunk at a time, as the rest: a batch waits for one at most
            self.wanted.append(shards[a:a + CHUNK])
        return True


def _open_rest(ref: weakref.ref, n: int, sums: bool, wanted: deque) -> None:
    """Chunk after chunk, each inside ``background.fetching()``: a fork waits for the chunk (its
    descriptors, open between ``open_shards`` and the mapping, would be the child's for good; a
    DataLoader's workers had kept up to 32 each), and the process's exit lets it end first. It ends
    once every shard is open: a batch that overtook it opens the rest while the thread waits for the
    lock, so the thread lives until then (``lmdata bench``'s warm-up waits for it)."""
    _name_for_the_kernel()
    at = 0
    while at < n and not background.stopping():
        reader = ref()
        if reader is None or mapping_room() <= 0 or reader._n_sources >= n:  # (batches overtook it: all open)
            return
        try:
            with background.fetching():
                if wanted:
                    reader._touch_behind(wanted.popleft().tolist(), sums)
                else:
                    reader._touch_behind(range(at, min(n, at + CHUNK)), sums)
                    at += CHUNK
        except Exception:  # noqa: BLE001 - the batch that meets the shard opens it and names what is wrong
            return
        del reader
