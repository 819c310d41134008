"""A keyed pseudo-random permutation of ``range(n)`` in O(1) memory.

An epoch of 10^10 samples cannot be shuffled by materialising its indices, so the order
is a bijection computed on demand: a keyed integer hash that is invertible on the
smallest power-of-two domain ``>= n`` (rounds of xor/add key, multiply by an odd key,
xor-shift; the construction of Kensler's "Correlated Multi-Jittered Sampling"
``permute``, widened to 64 bits), with cycle-walking (hash again until the value lands
below ``n``; the domain is below ``2n``, so fewer than 2 passes on average). The keys come
from ``(seed, epoch)``, so each epoch has its own order, and a batch's indices come from
one vectorised call::

    >>> p = Permutation(10, seed=0, epoch=0)
    >>> sorted(p(np.arange(10)).tolist()) == list(range(10))
    True
"""

from __future__ import annotations

import numpy as np

try:  # the same bijection in C (``_permute.c``); without a compiler, the NumPy path below
    from lmdata.data._permute import permute as _permute_c
except ImportError:  # pragma: no cover - exercised only on an install without the C extension
    _permute_c = None

_MASK64 = (1 << 64) - 1
_ROUNDS = 4


def mix64(x: int) -> int:
    """splitmix64's finaliser on a Python int: a cheap, well-spread 64-bit hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_key(*parts: int) -> int:
    """One 64-bit key from several integers (seed, epoch, rank, ...), order-sensitive."""
    key = 0x6C6D64617461  # "lmdata"
    for part in parts:
        key = mix64(key ^ (int(part) & _MASK64))
    return key


def mix64_array(x: np.ndarray, key: int) -> np.ndarray:
    """``mix64(key + x)`` for each element of ``x`` (uint64 NumPy arithmetic, wrapping)."""
    with np.errstate(over="ignore"):
        x = np.asarray(x, dtype=np.int64).astype(np.uint64) + np.uint64(key) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class Permutation:
    """``p(i)`` for ``i`` in ``range(n)``: a bijection keyed by ``(seed, epoch)``, O(1) state."""

    def __init__(self, n: int, seed: int = 0, epoch: int = 0) -> None:
        if n < 0 or n >= 1 << 62:
            raise ValueError(f"permutation size must be in [0, 2^62), got {n}")
        self.n = int(n)
        bits = max(1, (self.n - 1).bit_length())  # domain 2^bits: at least n, below 2n
        self._mask = np.uint64((1 << bits) - 1)
        self._shifts = (np.uint64(max(1, bits // 2)), np.uint64(max(1, (bits + 2) // 3)))
        key, mask = derive_key(seed, epoch), (1 << bits) - 1
        words = [mix64(key + i) for i in range(4 * _ROUNDS)]
        # per round: k_xor, k_mul1 (odd), k_add, k_mul2 (odd)
        self._key_words = np.array([w & mask if i % 2 == 0 else w | 1 for i, w in enumerate(words)], dtype=np.uint64)

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        """One pass of the keyed bijection of ``[0, 2^bits)`` (in place on a uint64 copy).

        Each step is invertible modulo 2^bits: xor/add a key, multiply by an odd key
        (carries mix low bits upwards), xor-shift right (mixes high bits downwards).
        """
        mask, (s1, s2) = self._mask, self._shifts
        with np.errstate(over="ignore"):
            for k_xor, k_mul1, k_add, k_mul2 in self._key_words.reshape(_ROUNDS, 4):
                x ^= k_xor
                x *= k_mul1
                x &= mask
                x ^= x >> s1
                x += k_add
                x *= k_mul2
                x &= mask
                x ^= x >> s2
        return x

    def __call__(self, indices: np.ndarray | int) -> np.ndarray:
        """The permuted values of ``indices`` (int64 array of the same shape)."""
        idx = np.asarray(indices, dtype=np.int64)
        if _permute_c is not None:
            flat = np.ascontiguousarray(idx).reshape(-1)
            out = np.empty(flat.shape, dtype=np.int64)
            _permute_c(flat, out, self.n, int(self._mask), int(self._shifts[0]), int(self._shifts[1]), self._key_words)
            return out.reshape(idx.shape)
        return self._call_numpy(idx)

    def _call_numpy(self, idx: np.ndarray) -> np.ndarray:
        """``__call__`` in NumPy: the reference the C path is tested against."""
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            raise IndexError(f"permutation index out of range [0, {self.n})")
        out = self._encrypt(idx.astype(np.uint64).reshape(-1))
        n = np.uint64(self.n)
        todo = np.flatnonzero(out >= n)
        while todo.size:  # cycle-walking: terminates because the start value is < n
            out[todo] = self._encrypt(out[todo])
            todo = todo[out[todo] >= n]
        return out.astype(np.int64).reshape(idx.shape)

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"Permutation(n={self.n})"
