"""Block checksums: the sidecar format, aligned ranges, coalescing, bit flips, row checksums."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lmdata.errors import LmdataError
from lmdata.store.blocks import BlockSums, row_checksums


def test_sidecar_round_trip_and_damage():
    data = np.arange(5000, dtype="<u2").tobytes()
    sums = BlockSums.of(data, block_bytes=4096)
    assert (sums.n_blocks, sums.data_bytes) == (3, 10000)
    raw = sums.encode()
    back = BlockSums.decode(raw, "t.crc")
    assert (back.block_bytes, back.data_bytes, back.crcs.tolist()) == (4096, 10000, sums.crcs.tolist())
    for bad in (raw[:-1], b"XXXXXXXX" + raw[8:], raw[:10]):
        with pytest.raises(LmdataError, match="t.crc"):
            BlockSums.decode(bad, "t.crc")


@given(st.integers(0, 9999), st.integers(1, 3000))
def test_aligned_range_covers_and_is_block_aligned(start, length):
    sums = BlockSums.of(bytes(10000), block_bytes=4096)
    stop = min(start + length, 10000)
    a, b = sums.aligned(start, stop)
    assert a % 4096 == 0 and (b % 4096 == 0 or b == 10000) and a <= start and stop <= b


def test_every_bit_flip_is_caught_in_the_block_it_hits():
    data = bytearray(np.random.default_rng(0).integers(0, 256, 9000, dtype=np.uint8).tobytes())
    sums = BlockSums.of(bytes(data), block_bytes=1024)
    for pos in range(0, 9000, 97):
        flipped = bytearray(data)
        flipped[pos] ^= 1 << (pos % 8)
        a, b = sums.aligned(pos, pos + 1)
        with pytest.raises(LmdataError, match=f"shard 7: block {pos // 1024} "):
            sums.check(a, bytes(flipped[a:b]), "shard 7")
        assert sums.bad_blocks(0, bytes(flipped)) == [pos // 1024]
    sums.check(0, bytes(data), "ok")


def test_row_checksums_catch_a_changed_token():
    values = np.arange(100, dtype=np.uint32)
    offsets = np.array([0, 10, 10, 55, 100])
    crcs = row_checksums(values, offsets)
    assert np.array_equal(row_checksums(values.astype(">u4"), offsets), crcs)  # little-endian bytes always
    values[60] ^= 4
    assert np.flatnonzero(row_checksums(values, offsets) != crcs).tolist() == [3]
    assert row_checksums(values, offsets, np.array([3, 0])).tolist() == [row_checksums(values, offsets)[3], crcs[0]]


@given(st.binary(max_size=20000), st.integers(1, 5000))
def test_block_crcs_in_c_equal_zlib_block_by_block(data, block_bytes):
    import zlib

    from lmdata.io.descriptors import block_crcs as c_block_crcs
    from lmdata.store.blocks import block_crcs

    if c_block_crcs is None:  # pragma: no cover - installed without a compiler
        pytest.skip("the C extension is not built")
    want = [zlib.crc32(data[i:i + block_bytes]) for i in range(0, len(data), block_bytes)]
    got = block_crcs(data, block_bytes)
    assert got.dtype == np.uint32 and got.tolist() == want


def test_block_crcs_in_c_refuse_a_wrong_output_size():
    from lmdata.io.descriptors import block_crcs as c_block_crcs

    if c_block_crcs is None:  # pragma: no cover
        pytest.skip("the C extension is not built")
    with pytest.raises(ValueError, match="one uint32 per block"):
        c_block_crcs(bytes(10000), 4096, np.empty(2, np.uint32))
    with pytest.raises(ValueError, match="block_bytes must be > 0"):
        c_block_crcs(bytes(10), 0, np.empty(1, np.uint32))


@given(st.lists(st.integers(0, 3000), max_size=40).map(sorted), st.binary(min_size=0, max_size=6000))
def test_row_checksums_in_c_equal_zlib_row_by_row(cuts, data):
    """Lance's row CRCs go through one C call (``span_crcs``): the same as zlib over each row's bytes,
    empty rows included, and the subset of rows asked for, in the order asked."""
    import zlib

    from lmdata.io.descriptors import span_crcs

    if span_crcs is None:  # pragma: no cover - installed without a compiler
        pytest.skip("the C extension is not built")
    values = np.frombuffer(data[:len(data) // 2 * 2], dtype="<u2")
    offsets = np.array([0, *[min(c, len(values)) for c in cuts], len(values)], dtype=np.int64)
    raw = values.tobytes()
    want = [zlib.crc32(raw[2 * a:2 * b]) for a, b in zip(offsets[:-1], offsets[1:])]
    assert row_checksums(values, offsets).tolist() == want
    rows = np.arange(len(want))[::-2]
    assert row_checksums(values, offsets, rows).tolist() == [want[r] for r in rows]


def test_span_crcs_refuse_spans_outside_the_data():
    from lmdata.io.descriptors import span_crcs

    if span_crcs is None:  # pragma: no cover
        pytest.skip("the C extension is not built")
    out = np.empty(1, np.uint32)
    for lo, hi in ((0, 11), (5, 4), (-1, 3)):
        with pytest.raises(ValueError, match="span_crcs"):
            span_crcs(b"0123456789", np.array([lo], np.int64), np.array([hi], np.int64), out)
