"""``open_shards``: many shards' first touch in one C call; anything it cannot do is left to Python."""

from __future__ import annotations

import os

import numpy as np
import pytest

from lmdata.io import descriptors as d
from lmdata.store.blocks import BlockSums

pytestmark = pytest.mark.skipif(d.open_shards is None, reason="the C reader was not built")


def _shard(tmp_path, name, n_tokens, block_bytes=4096):
    tokens = (np.arange(n_tokens, dtype=np.uint32) * 7 + len(name)).astype(np.uint16)
    path = tmp_path / f"{name}.bin"
    tokens.tofile(path)
    sums = BlockSums.of(tokens, block_bytes)
    (tmp_path / f"{name}.bin.crc").write_bytes(sums.encode())
    return str(path), sums


def _call(paths, sizes, sidecars, crc_at, n_crcs, floor=0, low_left=None):
    n = len(paths)
    want = [os.path.getsize(s) if s and os.path.exists(s) else 0 for s in sidecars]
    raw_at = np.concatenate([[0], np.cumsum(want)]).astype(np.int64)
    raw = np.empty(int(raw_at[-1]) + 1, np.uint8)
    fds, status = np.full(n, -7, np.int32), np.full(n, -7, np.int8)
    crcs = np.zeros(n_crcs, np.uint32)
    d.open_shards([os.fsencode(p) for p in paths], [os.fsencode(s) if s else b"" for s in sidecars],
                  np.array(sizes, np.int64), floor, n if low_left is None else low_left, fds, crcs,
                  np.array(crc_at, np.int64), raw, raw_at, status)
    return fds, status, crcs, raw, raw_at


def _close(fds):
    for fd in fds.tolist():
        if fd >= 0:
            os.close(fd)


def test_opens_sizes_and_loads_each_shards_crcs_where_asked(tmp_path):
    a, sa = _shard(tmp_path, "a", 5000)  # 10,000 bytes: 3 blocks, the last short
    b, sb = _shard(tmp_path, "bb", 2048)  # exactly 1 block
    fds, status, crcs, raw, raw_at = _call([a, b], [10000, 4096], [a + ".crc", b + ".crc"], [0, 3], 4)
    assert status.tolist() == [0, 0]
    assert crcs.tolist() == sa.crcs.tolist() + sb.crcs.tolist()
    assert bytes(raw[raw_at[1]:raw_at[2]]) == open(b + ".crc", "rb").read()  # the caller hashes these bytes
    assert [os.fstat(fd).st_size for fd in fds.tolist()] == [10000, 4096]
    assert all(os.get_inheritable(fd) is False for fd in fds.tolist())
    _close(fds)
    fds, status, crcs, _, _ = _call([a], [10000], [""], [0], 4)  # no sidecar asked: the file only
    assert status.tolist() == [0] and not crcs.any()
    _close(fds)


def test_what_it_cannot_do_is_reported_per_shard_with_nothing_left_open(tmp_path):
    good, _ = _shard(tmp_path, "good", 3000)
    other, _ = _shard(tmp_path, "other", 3000, block_bytes=8192)  # another block size: the Python path's
    link = str(tmp_path / "link.bin")
    os.symlink(good, link)
    long_crc = str(tmp_path / "long.crc")
    with open(long_crc, "wb") as fh:
        fh.write(open(good + ".crc", "rb").read() + b"\0")
    bad_magic = str(tmp_path / "magic.crc")
    with open(bad_magic, "wb") as fh:
        fh.write(b"X" + open(good + ".crc", "rb").read()[1:])
    before = set(os.listdir("/proc/self/fd"))
    cases = [  # (path, size, sidecar, status)
        (str(tmp_path / "missing.bin"), 6000, "", 1),
        (good, 6001, "", 1),  # the manifest's size differs
        (link, 6000, "", 1),  # a symlink: resolved (and checked to stay inside the store) in Python
        (str(tmp_path), 6000, "", 1),  # not a regular file
        (good, 6000, str(tmp_path / "nothing.crc"), 2),
        (good, 6000, long_crc, 2),
        (good, 6000, bad_magic, 2),
        (other, 6000, other + ".crc", 2),
        (good, 6000, good + ".crc", 0),
    ]
    sidecars = [c[2] for c in cases]
    n = len(cases)
    raw_at = np.concatenate([[0], np.cumsum([os.path.getsize(s) if s and os.path.exists(s) else 0 for s in sidecars])])
    raw_at[sidecars.index(long_crc) + 1:] -= 1  # the manifest records one byte less than the file has
    raw = np.empty(int(raw_at[-1]) + 1, np.uint8)
    fds, status = np.empty(n, np.int32), np.empty(n, np.int8)
    d.open_shards([os.fsencode(c[0]) for c in cases], [os.fsencode(s) for s in sidecars],
                  np.array([c[1] for c in cases], np.int64), 0, n, fds, np.zeros(2 * n, np.uint32),
                  np.zeros(n, np.int64), raw, raw_at.astype(np.int64), status)
    assert status.tolist() == [c[3] for c in cases]
    assert (fds[status == 1] == -1).all() and (fds[status != 1] >= 0).all()
    _close(fds)
    assert set(os.listdir("/proc/self/fd")) == before  # the sidecars were closed too


def test_descriptors_move_above_the_floor_after_low_left(tmp_path):
    paths = [_shard(tmp_path, f"s{i}", 100)[0] for i in range(4)]
    fds, status, _, _, _ = _call(paths, [200] * 4, [""] * 4, [0] * 4, 1, floor=900, low_left=2)
    assert status.tolist() == [0] * 4
    assert (fds[:2] < 900).all() and (fds[2:] >= 900).all()
    _close(fds)


def test_bad_arguments_raise_instead_of_reading_out_of_bounds(tmp_path):
    path, _ = _shard(tmp_path, "a", 100)
    one = np.zeros(1, np.int64)
    args = ([os.fsencode(path)], [b""], np.array([200], np.int64), 0, 1, np.zeros(1, np.int32),
            np.zeros(1, np.uint32), one, np.zeros(1, np.uint8), np.zeros(2, np.int64), np.zeros(1, np.int8))
    d.open_shards(*args)
    with pytest.raises(ValueError, match="open_shards"):
        d.open_shards([path], *args[1:])  # str, not bytes
    with pytest.raises(ValueError, match="open_shards"):
        d.open_shards(*args[:9], np.zeros(1, np.int64), *args[10:])  # raw_at one short
    with pytest.raises(ValueError, match="open_shards"):  # its CRCs would land past the array
        d.open_shards(args[0], [os.fsencode(path + ".crc")], *args[2:6], np.zeros(0, np.uint32), *args[7:])
    os.close(int(args[5][0]))


def test_the_pool_takes_what_was_opened_elsewhere(tmp_path):
    paths = [_shard(tmp_path, f"s{i}", 100)[0] for i in range(3)]
    pool = d.Descriptors(4)
    pool.get(paths[0])
    assert pool.room() == 3
    floor, low_left = pool.reserve(2)
    assert (floor, low_left) == (0, 2)
    for p in paths[1:]:
        pool.adopt(p, os.open(p, os.O_RDONLY))
    assert pool.room() == 1 and pool.get(paths[2]) == pool.fds[paths[2]]
    pool.close_all()
