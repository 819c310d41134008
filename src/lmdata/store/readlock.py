"""The readers' lock: a store that a process is reading cannot be overwritten under it.

Without it, ``lmdata ingest --overwrite`` on a store a training run is reading would leave
Lance readers failing on vanished fragments and memmap/Parquet readers serving a mix of the
old store (shards already mapped) and the new one (shards first touched after), silently.

The design: a **readers' lock**, not versioned publish. ``<store>/.lock`` is already the
file an ingest holds ``flock(LOCK_EX)`` on for its whole run (``filelock``'s lock on POSIX); every process that reads the
store holds ``flock(LOCK_SH)`` on the same file for as long as a reader of it is alive there.
So an ingest into a store being read is refused (``ingest.output.lock`` names the readers'
pids, read from ``/proc/locks``), and a reader of a store being written is refused (naming
the ingest); no process ever waits. Versioned publish (each ingest into a new
``v<N>/`` directory, the manifest pointing at the newest, old versions kept until their
last reader leaves) would let both proceed, but it changes the store layout every format,
the ownership rules (issue 20) and the object-storage work rely on, and still needs this
very lock to know when an old version may be deleted. The lock is the smaller, complete fix.

Who holds it: ``Store.reader`` (every reader a process makes from a store: the loader's
dataset, ``verify``, ``inspect``, ``sql``) takes one shared lock per store per process,
counted per reader object and released when the last of them is garbage collected. A forked
DataLoader worker inherits the lock with the open file; a spawned one runs only while its
parent's loader (and so its reader) is alive. A reader made before an overwrite cannot read
the new store by accident either: ``check_unchanged`` compares the manifest's identity
(inode, mtime, size) with the one the store was opened with, after taking the lock.

The lock is advisory and local: a read-only store (no ``.lock`` and no right to create it)
is read without one -- nothing of ours can overwrite it there -- and object-storage stores
have no flock at all.
"""

from __future__ import annotations

import os
import weakref
from pathlib import Path
from typing import Any

from lmdata.errors import LmdataError
from lmdata.store.layout import LOCK_NAME

# store directory (real path) -> (pid, fd, live reader count); per process (a fork's entry is its parent's)
_held: dict[str, tuple[int, int, int]] = {}


def manifest_identity(store: Path) -> tuple[int, int, int] | None:
    """(inode, mtime ns, size) of ``<store>/manifest.json``: a rename-replaced manifest differs."""
    try:
        st = os.stat(Path(store) / "manifest.json")
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def check_unchanged(store: Path, opened: tuple[int, int, int] | None) -> None:
    """Refuse when the store's manifest is no longer the one it was opened with."""
    if opened is not None and manifest_identity(store) != opened:
        raise LmdataError(
            f"{store}: the store was replaced (its manifest.json changed) after it was opened here; "
            "open it again to read the new store"
        )


def holders(path: Path, kind: str) -> list[int]:
    """Pids holding a flock of ``kind`` ("READ" or "WRITE") on ``path``, from /proc/locks (Linux)."""
    try:
        ino = os.stat(path).st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    pids = []
    for line in lines:
        parts = line.split()
        if "->" in parts:  # a waiter, not a holder
            continue
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[3] == kind and parts[5].rsplit(":", 1)[-1] == str(ino):
            pids.append(int(parts[4]))
    return sorted(set(pids))


def _open_lock(store: Path) -> int | None:
    path = Path(store) / LOCK_NAME
    try:
        return os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError:
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # a read-only store without a lock file: nothing of ours can overwrite it
            return None


def hold(store: str | Path, owner: Any) -> None:
    """Hold the shared readers' lock of the local ``store`` in this process while ``owner`` is alive."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock, no readers' lock
        return
    key, pid = os.path.realpath(store), os.getpid()
    entry = _held.get(key)
    if entry is not None and entry[0] != pid:  # inherited from the parent: its fd stays the parent's
        entry = None
    if entry is None:
        fd = _open_lock(Path(key))
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            writers = holders(Path(key) / LOCK_NAME, "WRITE")
            who = f" (pid {', '.join(map(str, writers))})" if writers else ""
            raise LmdataError(
                f"{store}: an ingest{who} is writing this store right now (lock {Path(store) / LOCK_NAME}); "
                "wait for it to finish, then open the store again"
            ) from None
        entry = (pid, fd, 0)
    _held[key] = (entry[0], entry[1], entry[2] + 1)
    weakref.finalize(owner, _release, key, pid)


def _release(key: str, pid: int) -> None:
    entry = _held.get(key)
    if entry is None or entry[0] != pid or os.getpid() != pid:
        return
    if entry[2] <= 1:
        del _held[key]
        os.close(entry[1])
    else:
        _held[key] = (pid, entry[1], entry[2] - 1)
