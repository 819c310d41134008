"""The descriptor pool behind positional reads: bounded, per thread, closed in forked children."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from lmdata.errors import LmdataError
from lmdata.io import descriptors as d


def _files(tmp_path, n):
    paths = []
    for i in range(n):
        p = tmp_path / f"f{i}.bin"
        np.full(1024, i, np.uint32).tofile(p)
        paths.append(str(p))
    return paths


def test_the_pool_keeps_at_most_its_size_open_and_reads_every_file(tmp_path):
    pool, paths = d.Descriptors(3), _files(tmp_path, 10)
    for rounds in range(2):
        for i, p in enumerate(paths):
            buf = np.empty(4, np.uint32)
            assert os.preadv(pool.get(p), [buf], 400) == 16 and (buf == i).all()
            assert len(pool.fds) <= 3
    assert pool.epoch > 0  # closing one tells cached descriptors they may be stale
    before = pool.epoch
    pool.forget(paths[-1])
    assert pool.epoch == before + 1 and paths[-1] not in pool.fds
    pool.close_all()
    assert not pool.fds


def test_a_short_read_names_the_file(tmp_path):
    (path,) = _files(tmp_path, 1)
    with pytest.raises(LmdataError, match=r"f0\.bin: 8 bytes at offset 4092 asked, 4 read.*lmdata verify"):
        d.read_into(path, memoryview(bytearray(8)), 4092)


@pytest.mark.skipif(d.preads is None, reason="the C reader was not built")
def test_preads_reads_each_piece_in_turn_and_reports_the_first_short_one(tmp_path):
    paths = _files(tmp_path, 3)
    pool = d.Descriptors(8)
    fds = np.array([pool.get(p) for p in paths], np.int32)
    out = np.zeros(12, np.uint8)
    assert d.preads(fds, np.array([0, 4, 8], np.int64), np.array([4, 4, 4], np.int64), out) == -1
    assert out.view(np.uint32).tolist() == [0, 1, 2]
    assert d.preads(fds, np.array([0, 4096, 8], np.int64), np.array([4, 4, 4], np.int64), out) == 1  # past the end
    with pytest.raises(ValueError, match="differ in count|too small"):
        d.preads(fds, np.array([0, 0], np.int64), np.array([4, 4, 4], np.int64), out)
    with pytest.raises(ValueError, match="too small"):
        d.preads(fds, np.zeros(3, np.int64), np.full(3, 8, np.int64), out)


def test_each_thread_has_its_own_pool():
    pools = []
    t = threading.Thread(target=lambda: pools.append(d.descriptors()))
    t.start()
    t.join()
    assert pools[0] is not d.descriptors() and pools[0].size <= d.descriptors().size


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_closes_the_descriptors_it_inherited(tmp_path):
    (path,) = _files(tmp_path, 1)
    fd = d.descriptors().get(path)
    pid = os.fork()
    if pid == 0:  # the child: its first use of the pool closes the parent's copy
        d.descriptors()
        try:
            os.fstat(fd)
            os._exit(1)
        except OSError:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    os.fstat(fd)  # the parent's own stays open


def test_the_soft_limit_is_raised_and_descriptors_sit_above_select_s_range(tmp_path):
    """As Ray and Dask do: a soft limit below the hard one is raised; with room, the pool's descriptors
    beyond its first 256 are placed at 1024 or above, leaving select()'s range to everything else."""
    paths = _files(tmp_path, d.LOW_DESCRIPTORS + 4)
    code = textwrap.dedent(f"""
        import resource
        from lmdata.io.descriptors import descriptors
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        pool = descriptors()
        fds = [pool.get(p) for p in {paths!r}]
        print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], pool.size, fds[0], fds[-1], hard)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    soft, size, first, last, hard = map(int, out.stdout.split())
    assert soft == min(hard, d.RAISE_SOFT_TO) and size == d.main_pool_size(soft)
    assert first < 1024
    assert last >= 1024 if soft >= 4096 else last < soft


def test_under_a_hard_limit_the_pool_takes_half_and_survives_exhaustion(tmp_path):
    paths = _files(tmp_path, 40)
    code = textwrap.dedent(f"""
        import os, resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        from lmdata.io.descriptors import descriptors
        pool = descriptors()
        hog = []
        try:
            while True:
                hog.append(os.open("/dev/null", os.O_RDONLY))  # something else takes every descriptor left
        except OSError:
            pass
        os.close(hog.pop())
        for p in {paths!r}:
            pool.get(p)  # a full table: the pool gives up half its own and goes on
        print(pool.size, len(pool.fds) <= pool.size)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["32", "True"], out.stderr


@pytest.mark.parametrize("soft, size", [(64, 32), (1024, 512), (2048, 1024), (4096, 3072), (20000, 15000),
                                        (65536, 49152), (1 << 20, d.MAX_POOL)])
def test_the_main_pool_is_the_limit_less_a_reserve(soft, size):
    """Half of a small limit, then a reserve of 1,024, then a quarter; never above MAX_POOL."""
    assert d.main_pool_size(soft) == size


@pytest.mark.skipif(d.read_windows is None, reason="the C reader was not built")
def test_read_windows_checks_new_blocks_once_and_stops_at_a_bad_one(tmp_path):
    import zlib

    data = np.arange(8192, dtype=np.uint16)  # 4 blocks of 4 KiB
    path = tmp_path / "t.bin"
    data.tofile(path)
    raw = data.tobytes()
    crcs = np.array([zlib.crc32(raw[k:k + 4096]) for k in range(0, len(raw), 4096)], np.uint32)
    done = np.zeros(4, np.uint8)
    pool = d.Descriptors(4)  # (held: a pool closes its descriptors when it goes)
    fds = np.full(2, pool.get(str(path)), np.int32)
    offsets, out = np.array([100, 5000], np.int64), np.zeros((2, 1025), np.uint16)
    sizes, base = np.full(2, len(raw), np.int64), np.zeros(2, np.int64)
    lens = np.full(2, 2050, np.int64)
    assert d.read_windows(fds, offsets, lens, sizes, base, done, crcs, out, True) == -1
    assert np.array_equal(out[0], data[50:1075]) and np.array_equal(out[1], data[2500:3525])
    assert done.tolist() == [1, 1, 0, 0]  # the blocks under the two windows, and no other
    bad = crcs.copy()
    bad[3] ^= 1
    offsets = np.array([6000, 13000], np.int64)
    assert d.read_windows(fds, offsets, lens, sizes, base, done, bad, out, True) == 1  # the window on block 3
    assert done.tolist() == [1, 1, 0, 0] or done.tolist() == [1, 1, 1, 0]
    assert done[3] == 0  # the failed block is never marked
    assert d.read_windows(fds[:1], np.array([20000], np.int64), lens[:1], sizes[:1], base[:1], done, crcs, out, False) == 0
    # pieces of different lengths end to end (a window across two files is two pieces); one past the end fails
    flat = np.zeros(3000, np.uint16)
    assert d.read_windows(fds, np.array([16000, 0], np.int64), np.array([384, 1000], np.int64), sizes, base, done,
                          crcs, flat, True) == -1
    assert np.array_equal(flat[:692], np.concatenate([data[8000:], data[:500]]))
    assert d.read_windows(fds[:1], np.array([16000], np.int64), np.array([386], np.int64), sizes[:1], base[:1],
                          np.zeros(4, np.uint8), crcs, flat, True) == 0


def _window_check(tmp_path, flip: bool) -> int:
    """read_windows over a 3-block file with its true CRCs (one byte flipped on disk when ``flip``)."""
    import zlib

    data = (np.arange(3 * 4096 // 2) % 65521).astype(np.uint16).tobytes()
    crcs = np.array([zlib.crc32(data[i:i + 4096]) for i in range(0, len(data), 4096)], np.uint32)
    path = tmp_path / "t.bin"
    path.write_bytes(data[:5000] + bytes([data[5000] ^ 1]) + data[5001:] if flip else data)
    fd = os.open(path, os.O_RDONLY)
    try:
        out = np.empty(2048, np.uint8)
        return d.read_windows(np.array([fd], np.int32), np.array([4000], np.int64), np.array([2048], np.int64),
                              np.array([len(data)], np.int64), np.array([0], np.int64), np.zeros(3, np.uint8),
                              crcs, out, True)
    finally:
        os.close(fd)


@pytest.mark.skipif(d.use_crc32 is None, reason="the C reads are not built")
def test_block_checks_use_isal_crc32_and_refuse_a_function_that_answers_otherwise(tmp_path):
    """ISA-L's CRC-32 (~3.5x zlib's here) checks the blocks where the isal package is installed; a
    function whose answers differ from zlib's (here zlib's own adler32) is refused, and zlib's used."""
    import ctypes
    import ctypes.util

    assert d.FAST_CRC32 == (d._isal_crc32() != 0)
    try:
        adler = ctypes.cast(ctypes.CDLL(ctypes.util.find_library("z") or "libz.so.1").adler32, ctypes.c_void_p).value
        assert d.use_crc32(adler) is False
        assert _window_check(tmp_path, flip=False) == -1 and _window_check(tmp_path, flip=True) == 0
    finally:
        d.use_crc32(d._isal_crc32())
    assert _window_check(tmp_path, flip=False) == -1 and _window_check(tmp_path, flip=True) == 0


def test_the_descriptor_table_is_grown_once_even_when_the_pool_reaches_the_limit(tmp_path):
    """A pool of the limit less its reserve reaches the last descriptor (4,096: a floor of 1,024 and a
    pool of 3,072): the table is grown to it in one try, not retried (a failed dup2) at every open."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"hard open-file limit {hard} < 4096")
    paths = _files(tmp_path, d.LOW_DESCRIPTORS // 4 + 8)
    code = textwrap.dedent(f"""
        import os, resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        import lmdata.io.descriptors as d
        d.RAISE_SOFT_TO = 4096
        tries = []
        grow = d._expand_table
        d._expand_table = lambda fd, top: tries.append(top) or grow(fd, top)
        pool = d.descriptors()
        for p in {paths!r}:
            pool.get(p)
        print(pool.floor + pool.size, tries)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "4096 [4095]", out.stdout + out.stderr


def test_growing_the_table_never_replaces_a_descriptor_another_pool_holds(tmp_path):
    """A pool grows the table to its top (``_expand_table``); another thread's pool may hold that
    number already, and its file must stay open there (``dup2`` had closed it and put another there)."""
    import fcntl

    held, other = tmp_path / "held", tmp_path / "other"
    held.write_bytes(b"held")
    other.write_bytes(b"other")
    with open(held, "rb") as fh, open(other, "rb") as gh:
        top = fcntl.fcntl(fh.fileno(), fcntl.F_DUPFD_CLOEXEC, 900)  # "another pool's" descriptor at 900+
        try:
            d._expand_table(gh.fileno(), top)
            assert os.pread(top, 4, 0) == b"held"
            assert os.fstat(top).st_ino == os.fstat(fh.fileno()).st_ino
        finally:
            os.close(top)


def test_a_threads_pool_closes_its_descriptors_when_the_thread_ends(tmp_path):
    """The loader's thread fallback (ThreadReads) starts new threads each epoch: their pools had leaked, 16
    descriptors a shard-reading thread an epoch, until the process hit its open-file limit."""
    import gc
    import threading

    from lmdata.io.descriptors import descriptors

    files = []
    for i in range(20):
        files.append(tmp_path / f"shard-{i}")
        files[-1].write_bytes(b"x" * 10)

    def open_all() -> None:
        for f in files:
            descriptors().get(str(f))

    def open_count() -> int:
        gc.collect()
        return len(os.listdir("/proc/self/fd"))

    before = open_count()
    for _ in range(5):
        t = threading.Thread(target=open_all)
        t.start()
        t.join()
    assert open_count() <= before + 1  # (+1: /proc/self/fd's own listing descriptor may differ)
