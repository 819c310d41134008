"""Lance's io_uring reader (``file+uring://``): chosen once per process, or plain files.

A take through io_uring costs about a third less wall time and half the CPU of Lance's
default local reader here (bench/README.md, "Lance layout"). ``io="auto"`` uses it on Linux
when a probe take works, ``"uring"`` insists, ``"file"`` never tries (``LMDATA_LANCE_IO``).
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from lmdata.errors import LmdataError

IO_ENV = "LMDATA_LANCE_IO"
IO_MODES = ("auto", "uring", "file")
# (pid, works): the process whose Lance started io_uring threads, and whether they work there.
# A fork inherits it, and so learns that its parent's ring threads did not come along.
_uring: tuple[int, bool] | None = None


def check_io_mode(io: str) -> str:
    if io not in IO_MODES:
        raise LmdataError(f"Lance io {io!r} (argument io= or ${IO_ENV}) is not one of {', '.join(IO_MODES)}")
    return io


def uring_uri(path: str | Path) -> str:
    """``path`` as Lance's io_uring URI: absolute, percent-quoted (Lance unquotes it)."""
    from urllib.parse import quote

    return "file+uring://" + quote(os.path.abspath(path))


def open_uring(format_dir: Path, plain: Any, column: str, io: str) -> Any:
    """The dataset through Lance's io_uring reader (``file+uring://``), or None to read ``plain`` files.

    A take through io_uring costs about a third less wall time and half the CPU of the
    default local reader here (bench/README.md, "Lance layout"). ``auto`` uses it on Linux
    when a probe take works (a kernel or container may forbid io_uring: Lance then fails
    every read with an OSError, it does not hang), and probes once per process; ``uring``
    insists, ``file`` never tries. A probe that fails on plain files too is the data's
    fault, not io_uring's: the dataset is returned and the read names the shard.
    """
    import lance

    global _uring
    if io == "file" or (io == "auto" and not sys.platform.startswith("linux")):
        return None
    pid = os.getpid()
    if _uring is not None and _uring[0] != pid:
        # forked from a process whose io_uring threads did not come along: a read would wait forever
        if io == "uring":
            raise LmdataError(f"{format_dir}: Lance's io_uring reader cannot run in a process forked after it "
                              "started; use spawn or forkserver, or io='file'")
        return None
    if _uring is not None and not _uring[1]:  # probed and failed in this process: warned then
        if io == "uring":
            raise LmdataError(f"{format_dir}: Lance's io_uring reader does not work here; set {IO_ENV}=file or io='file'")
        return None
    _uring = (pid, True)  # before the ring threads start: a fork from here on must not use them
    probe = [0] if plain.count_rows() else []
    try:
        ds = lance.dataset(uring_uri(format_dir))
        fragments = ds.get_fragments()
    except Exception as exc:
        return _no_uring(format_dir, io, exc, pid)
    try:
        if probe:
            fragments[0].take(probe, columns=[column])
        return ds
    except Exception as exc:
        try:
            plain.get_fragments()[0].take(probe, columns=[column])
        except Exception:
            return ds  # damaged data, not io_uring: the reads name the shard
        return _no_uring(format_dir, io, exc, pid)


def _no_uring(format_dir: Path, io: str, exc: Exception, pid: int) -> None:
    """Remember that io_uring fails in this process; ``uring`` raises, ``auto`` warns (once)."""
    global _uring
    _uring = (pid, False)
    if io == "uring":
        raise LmdataError(f"{format_dir}: Lance's io_uring reader does not work here ({exc}); "
                          f"set {IO_ENV}=file or io='file'") from exc
    warnings.warn(f"{format_dir}: Lance's io_uring reader does not work here ({exc}); reading plain files "
                  f"(set {IO_ENV}=file to skip this probe)", RuntimeWarning, stacklevel=2)
