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

from lmdata.errors import LmdataError, SettingError

IO_ENV = "LMDATA_LANCE_IO"
IO_MODES = ("auto", "uring", "file")
# Whether Lance's io_uring threads work in this process (None: not probed yet). A process forked
# after Lance ran never reads (``lance_fork``), so a fork inheriting this does not matter.
_uring: bool | None = None


def check_io_mode(io: str, from_env: bool = False) -> str:
    """``io`` if it is a mode; else an error (a ``SettingError`` when it came from ``$LMDATA_LANCE_IO``)."""
    if io not in IO_MODES:
        raise (SettingError if from_env else LmdataError)(
            f"Lance io {io!r} (argument io= or ${IO_ENV}) is not one of {', '.join(IO_MODES)}")
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
    if _uring is False:  # probed and failed in this process: warned then
        if io == "uring":
            raise LmdataError(f"{format_dir}: Lance's io_uring reader does not work here; set {IO_ENV}=file or io='file'")
        return None
    _uring = True
    probe = [0] if plain.count_rows() else []
    try:
        ds = lance.dataset(uring_uri(format_dir))
        fragments = ds.get_fragments()
    except Exception as exc:
        return _no_uring(format_dir, io, exc)
    try:
        if probe:
            fragments[0].take(probe, columns=[column])
        return ds
    except Exception as exc:
        try:
            plain.get_fragments()[0].take(probe, columns=[column])
        except Exception:
            return ds  # damaged data, not io_uring: the reads name the shard
        return _no_uring(format_dir, io, exc)


def _no_uring(format_dir: Path, io: str, exc: Exception) -> None:
    """Remember that io_uring fails in this process; ``uring`` raises, ``auto`` warns (once)."""
    global _uring
    _uring = False
    if io == "uring":
        raise LmdataError(f"{format_dir}: Lance's io_uring reader does not work here ({exc}); "
                          f"set {IO_ENV}=file or io='file'") from exc
    warnings.warn(f"{format_dir}: Lance's io_uring reader does not work here ({exc}); reading plain files "
                  f"(set {IO_ENV}=file to skip this probe)", RuntimeWarning, stacklevel=2)
