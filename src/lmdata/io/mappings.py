"""Read-only mappings of a split's raw token files, so a batch's windows are copied without a syscall.

    maps = Mappings(n_shards)
    maps.map(shards, paths, fds, sizes)      # each file mapped (and, if opened here, closed again)
    read_mapped(..., maps.bases, ...)        # io._preads: the batch memcpy'd out, blocks checked
    check_ahead(..., maps.bases, ...)        # a later batch checked and read on a thread of its own

Why a mapping and not ``pread``: at steady state a ``pread`` of a 2 KiB window costs ~1.6 us,
most of it the syscall and the file's kernel structures, which are cold when a batch's 32
windows fall in 32 of 1,000+ files (a raw batch: 50 us at 6 shards, 70 at 1,160); a copy out of
a mapping costs ~0.35 us a window at any shard count (11-14 us a batch). A mapping holds no
descriptor, so the shard count never meets ``ulimit -n`` once a shard is mapped.

What it costs: the pages a process has read stay mapped, so its RSS counts them (shared,
reclaimable page cache that ``pread`` reads too, without counting it), and a first touch of a
page takes a minor fault (on this kernel one fault maps a whole page-cache folio, so a first
epoch still reads faster than by ``pread``). The number of mappings a process may hold is
bounded (``vm.max_map_count``): past ``MAX_MAPPINGS`` shards, the rest are read by ``pread``.

A forked loader worker inherits its parent's mappings (read-only and shared: the same bytes)
and maps only what the parent had not; a pickled one (spawn, forkserver) starts with none.
Mappings are undone when their ``Mappings`` is collected, once the check-ahead thread has no job
left (``check_ahead``: a job may name them); one retired (its file was replaced) stays until then,
so no thread ever copies out of an unmapped range.
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from lmdata.errors import SettingError

try:
    from lmdata.io._preads import map_files, read_mapped, unmap
except ImportError:  # pragma: no cover - installed without a C compiler, or an extension built before it
    map_files = read_mapped = unmap = None
try:
    from lmdata.io._preads import check_ahead, check_ahead_wait
except ImportError:  # pragma: no cover - an extension built before the check-ahead thread: mappings still work
    check_ahead = check_ahead_wait = None


def _max_mappings() -> int:
    """Half the kernel's limit on a process's mappings (the rest is Python's, its libraries' and a
    DataLoader's), at most 65,536 shards."""
    try:
        with open("/proc/sys/vm/max_map_count") as fh:
            limit = int(fh.read())
    except (OSError, ValueError):
        limit = 65530  # Linux's default
    return max(0, min(1 << 16, limit // 2))


MAX_MAPPINGS = _max_mappings()


def mapping_on() -> bool:
    """Whether shards are mapped: yes, unless ``LMDATA_MAP_SHARDS=0`` (every window is then a ``pread``,
    and the process's RSS does not count the store's pages)."""
    if not _switch:
        value = os.environ.get("LMDATA_MAP_SHARDS", "1").strip()
        if value not in ("0", "1", ""):
            raise SettingError(f"LMDATA_MAP_SHARDS={value!r}: give 1 (map shards, the default) or 0 (read every "
                              "window with pread)")
        _switch.append(value != "0")
    return _switch[0]


def mapping_room() -> int:
    """How many more shards this process may map (``MAX_MAPPINGS`` less those mapped)."""
    return MAX_MAPPINGS - _live[0]


_switch: list[bool] = []  # LMDATA_MAP_SHARDS, read once
_lock = threading.RLock()  # one mapping per shard, whichever thread maps it (re-entered by a GC'd finalizer)
_live = [0]  # mappings held by this process's ``Mappings``


def _renew_lock() -> None:  # a fork while another thread held it must not leave the child's taken
    global _lock
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_lock)


def _unmap_all(bases: np.ndarray, sizes: np.ndarray, retired: list) -> None:
    """A collected ``Mappings``' mappings undone (never at exit: a daemon thread may still copy)."""
    if check_ahead_wait is not None:
        check_ahead_wait()  # a job may still read these mappings; finished jobs let go of their arrays
    mapped = bases != 0
    if unmap is None or not (mapped.any() or retired):
        return
    with _lock:
        gone = np.array(retired, dtype=np.int64).reshape(-1, 2)  # (base, size) rows
        unmap(np.concatenate([bases[mapped], gone[:, 0]]), np.concatenate([sizes[mapped], gone[:, 1]]))
        _live[0] -= int(mapped.sum()) + len(retired)
        bases[:] = 0
        retired.clear()


class Mappings:
    """Shard -> the address of its read-only mapping in this process (0: not mapped)."""

    def __init__(self, n_shards: int) -> None:
        self.bases = np.zeros(n_shards, dtype=np.int64)
        self.sizes = np.zeros(n_shards, dtype=np.int64)
        self._retired: list[tuple[int, int]] = []
        self.files: dict[int, tuple[int, int]] = {}  # shard -> (st_dev, st_ino) of a machine's copy mapped here
        self._finalizer = weakref.finalize(self, _unmap_all, self.bases, self.sizes, self._retired)
        self._finalizer.atexit = False  # the process's end unmaps; a daemon thread may still be copying

    def __reduce__(self) -> tuple:  # a pickled reader's worker maps its own
        return (Mappings, (len(self.bases),))

    def map(self, shards: list[int], paths: list[bytes], fds: np.ndarray, sizes: np.ndarray) -> bool:
        """Map each of ``shards`` (its file at ``paths``, or the open descriptor in ``fds``, -1 where none;
        ``sizes`` bytes long, checked). False: one could not be mapped (gone, resized, or past
        ``MAX_MAPPINGS``), and the caller's ``pread`` path reads it (and names what is wrong)."""
        with _lock:
            todo = [k for k, i in enumerate(shards) if not self.bases[i]]
            if not todo:
                return True
            room = mapping_room()
            if room <= 0:
                return False
            short, todo = len(todo) > room, todo[:room]  # as many as the limit leaves
            got = np.zeros(len(todo), dtype=np.int64)
            at = np.array([shards[k] for k in todo], dtype=np.int64)
            map_files([paths[k] for k in todo], np.ascontiguousarray(fds[todo], dtype=np.int32),
                      np.ascontiguousarray(sizes[todo], dtype=np.int64), got)
            self.sizes[at] = sizes[todo]
            self.bases[at] = got
            _live[0] += int(np.count_nonzero(got))
            return not short and bool(((got != 0) | (sizes[todo] == 0)).all())

    def retire(self, i: int) -> None:
        """Stop reading shard ``i`` from its mapping (its file was replaced); unmapped with the rest."""
        with _lock:
            self.files.pop(i, None)
            if self.bases[i]:
                self._retired.append((int(self.bases[i]), int(self.sizes[i])))
                self.bases[i] = 0
