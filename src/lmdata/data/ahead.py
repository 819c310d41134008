"""The next reads checked and read on a thread of their own: the 0-worker loader's look-ahead.

A loader with no workers reads, widens and hands out every batch on the training thread, and a
window's first read in a process also checks the CRCs of its 4 KiB blocks (and maps their
pages). ``LookAhead`` is then the loader's batch sampler: when the DataLoader takes a read's
indices (from a pass's fourth read on), later reads' go to the dataset's ``check_ahead``, which
hands their windows to the process's check-ahead thread (``io._preads.check_ahead``: C, never
taking the GIL). It checks and marks their unchecked blocks and copies the windows into a batch
of their own on another core, while the training thread widens and trains on the current read;
the read then takes that batch (``MappedWindows._take_read_ahead``). The read stays the
authority: what the thread could not read, or found bad, the read reads, checks and names itself,
so the batches and the errors are those of a loader without it. ``LMDATA_CHECK_AHEAD=0`` turns it
off.

Why the copy too, and not only the checks: on a store larger than the CPU's caches the copy is
read from DRAM, and on the training thread it was what kept a 1 G-token store's 0-worker reads at
~0.84x of a 12 M-token store's (the reader alone: 0.58 against 0.26 us a window). A fresh process
reading 1 G tokens (memmap), checks only against checks and copies, 8 alternated pairs: the 1 G
store's first epoch 490 -> 589 M tok/s, the 12 M store's 85 epochs 544 -> 612 (medians). Reads handed
over with nothing to check (a later epoch) are read too, so they are handed over at every group
as long as their jobs report work; a job that finds no window it can read and no block to check
reports 0, and then reads are handed over ever more rarely.

The reads are handed over ``GROUP`` at a time, every ``GROUP`` reads (each still a job of its own),
``AHEAD`` reads early at most: a group early, so the thread is a group ahead of the reads. Waking it
(a futex wake, an IPI to an idle vCPU) cost the training thread ~4% of a first epoch's samples
when it was woken for every read. 1 G tokens read once, a fresh process, 4 interleaved runs each
(blocks checked ahead, not read): GROUP 1 432-468 M tok/s, 4 420-513, 8 447-509 (median 457 -> 501).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice

from lmdata.errors import SettingError

ENV = "LMDATA_CHECK_AHEAD"
GROUP = 8  # reads handed over together, every GROUP reads: the thread is woken once for them (below)
AHEAD = 2 * GROUP  # reads taken from the sampler ahead of the current one: a group is handed over a group early
MAX_SKIP = 64  # reads not handed over after jobs that found nothing to check, at most (doubling up to it)


def check_ahead_on() -> bool:
    """``LMDATA_CHECK_AHEAD``: 1 (the default) or 0."""
    value = os.environ.get(ENV, "1").strip()
    if value not in ("0", "1", ""):
        raise SettingError(f"{ENV}={value!r}: give 1 (check the next read's blocks on a thread of their own, the "
                          "default) or 0 (the training thread checks them as it reads)")
    return value != "0"


class LookAhead:
    """A batch sampler handing out ``sampler``'s reads, every ``GROUP`` reads giving ``check`` the ``GROUP``
    after the current one, one by one (see the module docstring); ``check`` returns the blocks the jobs
    finished since its last call checked (-1: none finished yet)."""

    def __init__(self, sampler: Iterable[list[int]], check: Callable[[list[int]], int]) -> None:
        self.sampler, self.check = sampler, check
        self.skip = 0  # reads still not to hand over: the last jobs found nothing to check
        self.idle = 0  # how many handed-over reads in a row found nothing

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[list[int]]:
        reads = iter(self.sampler)
        first = next(reads, None)
        if first is None:
            return
        yield first  # a pass's first read (one batch) waits for nothing computed ahead
        upcoming: deque[list[int]] = deque(islice(reads, 1))
        k = handed = 0  # handed: how many of upcoming's reads (from its front) were handed over
        while upcoming:
            current = upcoming.popleft()
            handed = max(0, handed - 1)
            upcoming.extend(islice(reads, AHEAD - len(upcoming)))
            if k >= 1 and (k - 1) % GROUP == 0:  # from the third read on: a process's second read maps its shards,
                for read in islice(upcoming, handed, None):  # and a job handed over before it would find
                    self._hand_over(read)                      # nothing and back off; each read handed once
                handed = len(upcoming)
            k += 1
            yield current

    def _hand_over(self, indices: list[int]) -> None:
        if self.skip:
            self.skip -= 1
            return
        try:
            found = self.check(indices) or 0
        except Exception:  # noqa: BLE001 - never the read's error: the read raises its own, naming its samples
            self.skip, self.idle = 1 << 62, 0  # and no more hand-overs
            return
        if found > 0:
            self.idle = 0
        elif found == 0:
            self.idle += 1
            self.skip = min(MAX_SKIP, 1 << min(self.idle, 6)) - 1
