"""Shard files are opened with O_NOATIME where the process owns them, and as any reader where not."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile

import numpy as np
import pytest

from lmdata.io import descriptors as d

pytestmark = pytest.mark.skipif(not getattr(os, "O_NOATIME", 0), reason="no O_NOATIME on this platform")


def _shard(folder: str) -> str:
    path = os.path.join(folder, "tokens-00000.bin")
    np.arange(3000, dtype=np.uint16).tofile(path)
    os.chmod(path, 0o644)
    return path


def _noatime(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NOATIME)


def _open_both(path: str, size: int = 6000) -> tuple[int, int | None]:
    """The shard opened by the Python pool, and by the C first touch (None without the extension)."""
    pool_fd = d.Descriptors(4, 0).get(path, nofollow=True)
    if d.open_shards is None:
        return pool_fd, None
    fds, status = np.full(1, -1, np.int32), np.full(1, -1, np.int8)
    raw, raw_at = np.empty(1, np.uint8), np.zeros(2, np.int64)
    d.open_shards([os.fsencode(path)], [b""], np.array([size], np.int64), 0, 1, fds,
                  np.zeros(1, np.uint32), np.zeros(1, np.int64), raw, raw_at, status)
    assert status.tolist() == [0]
    return pool_fd, int(fds[0])


def test_a_shard_the_process_owns_is_opened_without_access_time_updates(tmp_path):
    for fd in _open_both(_shard(str(tmp_path))):
        if fd is not None:
            assert _noatime(fd)
            assert os.pread(fd, 4, 2) == np.arange(1, 3, dtype=np.uint16).tobytes()


def _foreign_file() -> tuple[str | None, str | None]:
    """A readable file this process's user (or, as root, ``nobody``) does not own, and a folder to remove."""
    if os.geteuid() == 0:  # root owns everything it makes: the child reads root's file as nobody
        folder = tempfile.mkdtemp(prefix="lmdata-noatime-", dir="/tmp")  # not $TMPDIR: it may be private
        os.chmod(folder, 0o755)
        return _shard(folder), folder
    for path in ("/etc/passwd", "/etc/hostname", "/etc/os-release"):
        if os.path.isfile(path) and os.access(path, os.R_OK) and os.stat(path).st_uid != os.geteuid():
            return path, None
    return None, None


def test_a_file_owned_by_another_user_is_still_opened_and_read():
    path, folder = _foreign_file()
    if path is None:
        pytest.skip("no readable file owned by another user")
    try:
        size = os.path.getsize(path)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports by its exit status
            code = 1
            try:
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                d._noatime_refused.clear()
                fds = [fd for fd in _open_both(path, size) if fd is not None]
                code = 0 if fds and all(not _noatime(fd) and len(os.pread(fd, size, 0)) == size for fd in fds) else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        if folder:
            shutil.rmtree(folder)
