"""The one way to write a file or a directory durably: tmp + fsync + rename (+ directory fsync).

    write_file(path, write)     write(tmp) fills .NAME.tmp-PID; fsync; rename onto path
                                (``drop_cache=True``: then its pages leave the page cache)
    write_bytes / write_text    the same for bytes or text in memory
    write_dir(dest, files)      a directory of files, fsynced, renamed into place as a whole

A crash leaves either the old content or the new one, never a torn file; the temporary
name ``.NAME.tmp-PID`` (``TMP_MARK``) is what ``cleanup_partial`` of a writer removes.

A full disk is one ``NoSpaceError`` naming the path, the bytes the write needed and the bytes
free (``space_for``, below), whatever the library's wording; the temporary is removed, so
nothing valid-looking is left.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lmdata.errors import LmdataError

TMP_MARK = ".tmp-"


# ---------------------------------------------------------------------------- a full disk
# A full disk reaches us in many words: ``OSError: 1044914 requested and 1021952 written``
# (numpy's ``tofile``, errno unset), Lance's ``No space left on device``, torch's ``unexpected
# pos`` RuntimeError. ``space_for`` recognises all of them -- ENOSPC/EDQUOT, the libraries'
# messages, and any write error while the filesystem has fewer bytes free than the write needs. The caller decides what happens to
# its partial output (an ingest keeps it resumable, a checkpoint removes its temporary file).

_MESSAGES = re.compile(r"No space left on device|Disk quota exceeded|\d+ requested and \d+ written|unexpected pos"
                       r"|file write failed")


class NoSpaceError(LmdataError):
    """A write failed for want of disk space (or quota)."""


def free_bytes(path: str | Path) -> int | None:
    """Bytes free to this user on the filesystem of ``path`` (its nearest existing parent)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def is_no_space(exc: BaseException, path: str | Path | None = None, needed: int = 0) -> bool:
    """Whether ``exc``, raised writing ``needed`` bytes at ``path``, was the disk filling up."""
    if isinstance(exc, NoSpaceError):
        return True
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if _MESSAGES.search(str(exc)):
        return True
    free = free_bytes(path) if path is not None and needed else None
    return free is not None and free < needed


def no_space(path: str | Path, needed: int, then: str = "") -> NoSpaceError:
    free = free_bytes(path)
    where = f"{free:,} bytes free there" if free is not None else "free space unknown"
    want = f"writing about {needed:,} bytes" if needed else "writing"
    return NoSpaceError(f"{path}: no space left on device ({want}, {where})" + (f"; {then}" if then else ""))


@contextmanager
def space_for(path: str | Path, needed: int = 0, then: str = "") -> Iterator[None]:
    """Turn a full disk met inside the block (writing ``needed`` bytes at ``path``) into ``NoSpaceError``.

    ``then``: what the user should do (the caller knows whether its output can be resumed).
    """
    try:
        yield
    except NoSpaceError:
        raise
    except (OSError, RuntimeError) as exc:  # pyarrow/Lance/numpy raise OSError, torch RuntimeError
        interrupt = _interrupt_behind(exc)
        if interrupt is not None:  # Ctrl-C inside torch.save surfaces as "file write failed"
            raise interrupt from None
        if not is_no_space(exc, path, needed):
            raise
        raise no_space(path, needed, then) from exc


def _interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt a library's write error was raised while handling, if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def temp_path(path: Path) -> Path:
    """The temporary name ``path`` is written under (hidden, tagged with our pid)."""
    path = Path(path)
    return path.with_name(f".{path.name}{TMP_MARK}{os.getpid()}")


def temp_dir(path: Path) -> Path:
    """A new hidden directory beside ``path`` to build it in, with the mode ``mkdir`` gives under the
    process's umask (``mkdtemp`` makes it 0700, which the rename would give the finished directory)."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}{TMP_MARK}", dir=path.parent))
    tmp.chmod(0o777 & ~_umask())
    return tmp


def _umask() -> int:
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)  # no /proc: read it by setting it (for an instant)
        os.umask(mask)
        return mask


def fsync_path(path: Path, drop_cache: bool = False) -> None:
    """fsync a file (its data) or a directory (its entries) by path; ``drop_cache``: then drop
    the file's pages from the page cache (``drop_cached``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if drop_cache:
            drop_cached(fd)
    finally:
        os.close(fd)


def drop_cached(fd: int, offset: int = 0, length: int = 0) -> None:
    """Drop the clean (already synced) pages of ``fd``'s range from the page cache (0: to the end).

    An ingest writes each shard once and does not read it back: kept, its pages fill the page
    cache, and every later page the ingest writes first makes the kernel reclaim one (and pushes
    out what the user had cached). Measured here (bench/README.md, "Ingest: the page cache"):
    400 files of 4 MiB written and fsynced cost 3.1-4.9 s of system time kept, 0.46 s dropped.
    Advice only: where the call does not exist, nothing changes.
    """
    if hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fsync_path(path)


def write_file(path: Path, write: Callable[[Path], None], *, sync_dir: bool = True, needed: int = 0,
               drop_cache: bool = False) -> bool:
    """Run ``write(tmp)``, fsync ``tmp`` and rename it to ``path``; fsync the directory unless
    ``sync_dir=False`` (a caller that syncs its directories once, later). A full disk is a
    ``NoSpaceError`` naming ``path`` and the ``needed`` bytes (about: 0 when unknown).
    ``drop_cache``: the file's pages leave the page cache once synced (a shard: ``drop_cached``).

    Returns whether ``path`` existed before (then its directory needs a fsync before a
    record names the new file).
    """
    path = Path(path)
    tmp = temp_path(path)
    try:
        with space_for(path, needed):
            write(tmp)
            fsync_path(tmp, drop_cache)
        replaced = os.path.lexists(path)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename not in (str(tmp), tmp):
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc  # named as the caller's file, not our temporary
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)
    return replaced


def write_bytes(path: Path, data: bytes) -> None:
    """``data`` into ``path``, durably."""
    write_file(path, lambda tmp: tmp.write_bytes(data), needed=len(data))


def write_text(path: Path, text: str) -> None:
    """``text`` (UTF-8) into ``path``, durably."""
    write_bytes(path, text.encode("utf-8"))


def write_dir(dest: Path, files: dict[str, bytes]) -> None:
    """A new directory ``dest`` holding ``files`` (name -> bytes), all durable, renamed into place."""
    dest = Path(dest)
    tmp = temp_path(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with space_for(dest, sum(map(len, files.values()))):
            for name, data in files.items():
                with open(tmp / name, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(tmp)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)
