"""``read_batch``: a batch's windows from their starts in one C call, pieces found in C."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmdata.io import descriptors as d
from lmdata.store.blocks import BlockSums

pytestmark = pytest.mark.skipif(d.read_batch is None, reason="the C reader was not built")


def _shards(tmp, sizes, mult=7919):
    """One file of uint16 tokens a shard of ``sizes`` under ``tmp``, their descriptors, CRCs and block indices
    (the caller closes ``fds``)."""
    stream = (np.arange(sum(sizes), dtype=np.int64) * mult % 65521).astype(np.uint16)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    fds, crcs, blocks = [], [], [0]
    s = {"stream": stream, "bounds": bounds, "file_bytes": np.array(sizes, np.int64) * 2,
         "modes": np.ones(len(sizes), np.int8), "paths": [tmp / f"s{i}.bin" for i in range(len(sizes))]}
    try:
        for i, path in enumerate(s["paths"]):
            stream[bounds[i]:bounds[i + 1]].tofile(path)
            fds.append(os.open(path, os.O_RDONLY))
            sums = BlockSums.of(path.read_bytes())
            crcs.append(sums.crcs)
            blocks.append(blocks[-1] + len(sums.crcs))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return {**s, "fds": np.array(fds, np.int32), "block_base": np.array(blocks, np.int64),
            "crcs": np.concatenate(crcs).astype(np.uint32)}


@pytest.fixture
def split(tmp_path):
    """Four shards of uint16 tokens (one empty): 6,000 / 0 / 5,000 / 10,000 bytes."""
    s = _shards(tmp_path, [3000, 0, 2500, 5000])
    yield s
    for fd in s["fds"].tolist():
        os.close(fd)


def _read(s, starts, length, check=True, done=None):
    done = np.zeros(len(s["crcs"]), np.uint8) if done is None else done
    out = np.zeros((len(starts), length), np.uint16)
    rc = d.read_batch(np.asarray(starts, np.int64), length, 2, s["bounds"], s["fds"], s["modes"], s["file_bytes"],
                      s["block_base"], done, s["crcs"], out, check)
    return rc, out, done


def test_windows_within_and_across_shards_including_an_empty_one(split):
    starts = np.array([0, 2990, 2999, 5400, 5480, 10500 - 1000, 1234])  # 2990..: shards 0 -> 2, over the empty 1
    rc, out, done = _read(split, starts, 1000)
    assert rc == -1
    np.testing.assert_array_equal(out, split["stream"][starts[:, None] + np.arange(1000)])
    assert done.all()
    rc, again, done2 = _read(split, starts, 1000, done=done.copy())  # every block checked: read only
    assert rc == -1 and (again == out).all()
    rc, _, few = _read(split, np.array([0, 2990]), 1000)
    assert rc == -1 and few[[0, 1, 2]].all() and not few[[3, 4, 5, 6]].any()  # only the blocks under them


def test_a_damaged_block_is_refused_and_left_unchecked(split):
    raw = bytearray(split["paths"][3].read_bytes())
    raw[4096 + 10] ^= 0xFF  # shard 3, block 1
    split["paths"][3].write_bytes(bytes(raw))  # in place: the open descriptor sees it
    bad_block = int(split["block_base"][3]) + 1
    starts = np.array([0, 5500 + 2048, 100])  # window 1 covers shard 3's bytes 4096..
    rc, _, done = _read(split, starts, 500)
    assert rc == 1 and not done[bad_block]
    rc, out, _ = _read(split, starts, 500, check=False)  # verify="size": read as it is
    assert rc == -1 and (out[1] != split["stream"][starts[1]:starts[1] + 500]).any()


def test_a_shard_not_ready_sends_the_batch_back_before_any_read(split):
    starts = np.array([0, 5600])
    for field, value in (("fds", -1), ("modes", 0)):
        s = dict(split, **{field: split[field].copy()})
        s[field][3] = value
        rc, out, done = _read(s, starts, 100)
        assert rc == -2 and not out.any() and not done.any()
    s = dict(split, modes=np.zeros(4, np.int8))
    assert _read(s, starts, 100, check=False)[0] == -1  # verify="size" needs no CRCs


def test_bad_arguments_raise(split):
    with pytest.raises(ValueError, match="read_batch"):
        _read(split, np.array([10_000]), 1000)  # past the split's end
    with pytest.raises(ValueError, match="read_batch"):
        d.read_batch(np.zeros(1, np.int64), 10, 2, split["bounds"], split["fds"][:2], split["modes"],
                     split["file_bytes"], split["block_base"], np.zeros(len(split["crcs"]), np.uint8), split["crcs"],
                     np.zeros(10, np.uint16), True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.one_of(st.just(0), st.integers(1, 60), st.integers(500, 700), st.integers(5000, 9000)),
                      min_size=9, max_size=120),
       seed=st.integers(0, 2**32 - 1), length=st.integers(1, 1500))
def test_windows_over_many_uneven_shards_match_the_stream(tmp_path_factory, sizes, seed, length):
    """More than 8 shards: ``shard_of`` guesses a token's shard from its share of the split and gallops
    from there; uneven sizes (empty shards, a run of large ones) put the guess far off."""
    if sum(sizes) < length:
        sizes.append(length)
    s = _shards(tmp_path_factory.mktemp("many"), sizes, mult=40503)
    stream, bounds = s["stream"], s["bounds"]
    try:
        rng = np.random.default_rng(seed)
        ends = np.concatenate([bounds[1:] - 1, [len(stream) - length]])  # each shard's last token, the last start
        starts = np.clip(np.concatenate([rng.integers(0, len(stream) - length + 1, 40), ends, bounds[:-1]]),
                         0, len(stream) - length)
        rc, out, _ = _read(s, starts, length)
        assert rc == -1
        np.testing.assert_array_equal(out, stream[starts[:, None] + np.arange(length)])
    finally:
        for fd in s["fds"].tolist():
            os.close(fd)
