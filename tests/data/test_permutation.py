"""Permutation: a bijection of range(n) for any n, keyed by (seed, epoch), O(1) memory."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.data import permutation
from lmdata.data.permutation import Permutation


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 17, 1000, 1021, 65537, 1_000_000])
def test_bijection(n):
    out = Permutation(n, seed=5, epoch=1)(np.arange(n))
    assert out.dtype == np.int64
    assert np.array_equal(np.sort(out), np.arange(n))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(-(2**63), 2**64), epoch=st.integers(0, 10**6))
def test_bijection_property(n, seed, epoch):
    out = Permutation(n, seed, epoch)(np.arange(n))
    assert np.array_equal(np.sort(out), np.arange(n))


def test_differs_across_epochs_and_seeds():
    n = 1000
    base = Permutation(n, 0, 0)(np.arange(n))
    assert not np.array_equal(base, np.arange(n))
    for other in (Permutation(n, 0, 1), Permutation(n, 1, 0), Permutation(n, 2**40, 0)):
        out = other(np.arange(n))
        assert (out == base).mean() < 0.05  # about 1/n agree by chance
    assert np.array_equal(Permutation(n, 0, 0)(np.arange(n)), base)  # deterministic


def test_huge_domain_without_allocation():
    n = 10**12
    p = Permutation(n, seed=3, epoch=7)
    idx = np.array([0, 1, 2, n // 2, n - 2, n - 1])
    out = p(idx)
    assert out.min() >= 0 and out.max() < n and len(set(out.tolist())) == len(idx)
    # spot check: one batch from the middle equals the same items asked one at a time
    batch = np.arange(123_456_789_000, 123_456_789_032)
    assert p(batch).tolist() == [int(p(np.array([i]))[0]) for i in batch]
    assert p._key_words.shape == (16,)  # O(1) state: 4 rounds of 4 keys, whatever n is


def test_spot_checks_million_match_full():
    n = 1_000_000
    p = Permutation(n, seed=11, epoch=2)
    full = p(np.arange(n))
    at = np.random.default_rng(0).integers(0, n, size=100)
    assert np.array_equal(p(at), full[at])


def test_order_is_fixed_across_releases():
    # a saved loader state resumes by (seed, epoch, position): the order itself must never change
    assert Permutation(1000, 5, 1)(np.arange(8)).tolist() == [561, 257, 300, 279, 433, 270, 967, 149]
    n = (1 << 40) + 7
    assert Permutation(n, -3, 2)(np.array([0, 1, n - 1])).tolist() == [707870207242, 980960695194, 778843964339]


def test_c_extension_is_built():
    assert permutation._permute_c is not None  # else every call runs the NumPy path below


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(0, 61), seed=st.integers(-(2**63), 2**64), epoch=st.integers(0, 10**6), data=st.data())
def test_c_path_equals_numpy_path(bits, seed, epoch, data):
    n = data.draw(st.integers(1 << bits, min((2 << bits) - 1, (1 << 62) - 1)))
    idx = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=40)), dtype=np.int64)
    p = Permutation(n, seed, epoch)
    assert np.array_equal(p(idx), p._call_numpy(idx))
    assert np.array_equal(p(idx[::-1].reshape(1, -1)), p._call_numpy(idx[::-1]).reshape(1, -1))  # strided, 2-D


def test_numpy_path_without_c_extension(monkeypatch):
    with_c = Permutation(12345, 7, 3)(np.arange(12345))
    monkeypatch.setattr(permutation, "_permute_c", None)
    assert np.array_equal(Permutation(12345, 7, 3)(np.arange(12345)), with_c)
    with pytest.raises(IndexError):
        Permutation(10)(np.array([10]))


def test_out_of_range_index():
    p = Permutation(10)
    with pytest.raises(IndexError):
        p(np.array([10]))
    with pytest.raises(IndexError):
        p(np.array([-1]))
    assert p(np.int64(3)).shape == ()
    assert Permutation(0)(np.array([], dtype=np.int64)).shape == (0,)


def test_roughly_uniform_positions():
    # item 0 should land anywhere: over many seeds its image is spread across the range
    n = 100
    images = [int(Permutation(n, s, 0)(np.array([0]))[0]) for s in range(400)]
    counts = np.bincount(np.array(images) // 10, minlength=10)
    assert counts.min() > 15  # expected 40 per decile


def test_no_obvious_structure():
    n = 4096
    out = Permutation(n, seed=1, epoch=0)(np.arange(n)).astype(float)
    assert abs(np.corrcoef(np.arange(n), out)[0, 1]) < 0.1
    gaps = np.abs(np.diff(out))
    assert np.median(gaps) > n / 5  # neighbours land far apart (uniform: median ~ 0.29 n)
    low_bits = (out.astype(np.int64) & 1)[::2]  # even inputs: half their images odd
    assert 0.4 < low_bits.mean() < 0.6
