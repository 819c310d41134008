"""``store.npy.int64_array``: our own ``.npy`` files read without ``np.load``, anything else through it."""

from __future__ import annotations

import io

import numpy as np
import pytest

from lmdata.store.npy import int64_array


def _npy(array: np.ndarray, **kwargs) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False, **kwargs)
    return buf.getvalue()


@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (100_003,), (0, 2), (5, 2), (3, 12), (1, 1)])
def test_what_np_save_writes_reads_back_the_same(shape):
    array = np.random.default_rng(sum(shape)).integers(-2**62, 2**62, size=shape, dtype=np.int64)
    got = int64_array(_npy(array))
    assert got.dtype == np.int64 and got.shape == array.shape and np.array_equal(got, array)


@pytest.mark.parametrize("array", [np.arange(6, dtype=np.int32), np.arange(6, dtype=">i8"), np.arange(6.0),
                                   np.asfortranarray(np.arange(12, dtype=np.int64).reshape(3, 4)),
                                   np.arange(24, dtype=np.int64).reshape(2, 3, 4), np.int64(5)])
def test_any_other_array_is_what_np_load_reads(array):
    raw = _npy(array)
    expected = np.load(io.BytesIO(raw), allow_pickle=False)
    got = int64_array(raw)
    assert got.dtype == expected.dtype and got.shape == expected.shape and np.array_equal(got, expected)


def test_a_short_or_long_file_is_np_loads_error_not_a_wrong_array():
    raw = _npy(np.arange(10, dtype=np.int64))
    with pytest.raises(ValueError):
        int64_array(raw[:-8])  # a value short
    assert np.array_equal(np.load(io.BytesIO(raw + b"x" * 8)), int64_array(raw + b"x" * 8))  # as np.load: extra ignored
    with pytest.raises(ValueError):
        int64_array(b"\x93NUMPY\x01\x00")
    with pytest.raises(ValueError):
        int64_array(b"not a numpy file at all")


def test_a_version_2_header_reads_too():
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.arange(4, dtype=np.int64), version=(2, 0))
    assert buf.getvalue()[6:8] == b"\x02\x00" and np.array_equal(int64_array(buf.getvalue()), np.arange(4))
