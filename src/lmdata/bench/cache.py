"""Cold page cache for one format of one split: evict its files before a cold run.

``posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` drops a file's clean pages from the page
cache without root (unlike ``echo 3 > /proc/sys/vm/drop_caches``). Dirty pages are not
dropped, so we ``fdatasync`` first; pages some process still maps stay too, so the bench
closes every loader (and its workers' memmaps) before evicting. ``resident_fraction`` asks
the kernel (``mincore``) how much of a file is cached, so a report can show the eviction
worked rather than assume it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path


def format_files(format_dir: Path) -> list[Path]:
    """Every regular file under a format directory (shards, Lance fragments, indexes)."""
    return sorted(p for p in Path(format_dir).rglob("*") if p.is_file() and not p.is_symlink())


def evict(paths: list[Path]) -> int:
    """Drop ``paths`` from the page cache; returns the bytes advised. Linux/POSIX only."""
    if not hasattr(os, "posix_fadvise"):
        from lmdata.errors import LmdataError

        raise LmdataError("--cache cold needs os.posix_fadvise (Linux); use --cache warm on this platform")
    total = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def _mincore():
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    fn = ctypes.CDLL(libc_name, use_errno=True).mincore
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    fn.restype = ctypes.c_int
    return fn


def resident_fraction(paths: list[Path]) -> float | None:
    """Fraction of the files' pages now in the page cache (None where mincore is unavailable)."""
    import numpy as np

    fn = _mincore()
    if fn is None:
        return None
    resident = pages = 0
    for path in paths:
        size = os.path.getsize(path)
        if size == 0:
            continue
        n = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * n)()
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, prot=mmap.PROT_READ) as mm:
            view = np.frombuffer(mm, dtype=np.uint8)  # only for its address; touches no page
            rc = fn(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec)
            del view
        if rc != 0:
            return None
        resident += sum(b & 1 for b in vec)
        pages += n
    return resident / pages if pages else 1.0
