"""The one way to write a file or a directory durably: tmp + fsync + rename (+ directory fsync).

    write_file(path, write)     write(tmp) fills .NAME.tmp-PID; fsync; rename onto path
    write_bytes / write_text    the same for bytes or text in memory
    write_dir(dest, files)      a directory of files, fsynced, renamed into place as a whole

A crash leaves either the old content or the new one, never a torn file; the temporary
name ``.NAME.tmp-PID`` (``TMP_MARK``) is what ``cleanup_partial`` of a writer removes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

TMP_MARK = ".tmp-"


def temp_path(path: Path) -> Path:
    """The temporary name ``path`` is written under (hidden, tagged with our pid)."""
    path = Path(path)
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")


def fsync_path(path: Path) -> None:
    """fsync a file (its data) or a directory (its entries) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fsync_path(path)


def write_file(path: Path, write: Callable[[Path], None], *, sync_dir: bool = True) -> bool:
    """Run ``write(tmp)``, fsync ``tmp`` and rename it to ``path``; fsync the directory unless
    ``sync_dir=False`` (a caller that syncs its directories once, later).

    Returns whether ``path`` existed before (then its directory needs a fsync before a
    record names the new file).
    """
    path = Path(path)
    tmp = temp_path(path)
    try:
        write(tmp)
        fsync_path(tmp)
        replaced = os.path.lexists(path)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)
    return replaced


def write_bytes(path: Path, data: bytes) -> None:
    """``data`` into ``path``, durably."""
    write_file(path, lambda tmp: tmp.write_bytes(data))


def write_text(path: Path, text: str) -> None:
    """``text`` (UTF-8) into ``path``, durably."""
    write_bytes(path, text.encode("utf-8"))


def write_dir(dest: Path, files: dict[str, bytes]) -> None:
    """A new directory ``dest`` holding ``files`` (name -> bytes), all durable, renamed into place."""
    dest = Path(dest)
    tmp = temp_path(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, data in files.items():
        with open(tmp / name, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    fsync_dir(tmp)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)
