"""Writes that meet a full disk: one error naming the path and the bytes, never a traceback.

Issue 19, case 3: an ingest into a small filesystem ended in ``OSError: 1044914 requested
and 1021952 written`` (numpy's ``tofile``, errno unset) or Lance's ``No space left on
device``; a checkpoint in torch's ``unexpected pos`` RuntimeError. Each library words it
differently, so ``space_for`` recognises all of them -- ``ENOSPC``/``EDQUOT``, the
libraries' messages, and any write error while the filesystem has fewer bytes free than
the write needs -- and raises ``NoSpaceError`` naming the path, the bytes the write needed
and the bytes free. The caller decides what happens to its partial output (an ingest keeps
it resumable, a checkpoint removes its temporary file); nothing valid-looking is left:
manifests and checkpoints are renamed into place only after a complete, fsynced write.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lmdata.errors import LmdataError

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
        if not is_no_space(exc, path, needed):
            raise
        raise no_space(path, needed, then) from exc
