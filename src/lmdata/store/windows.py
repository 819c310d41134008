"""Window arithmetic shared by the readers: where each window's tokens live.

A split's stream is cut into shards, and each shard into segments -- whatever a format
reads in one piece (a Parquet row group, a Lance row). ``Segments`` maps global offsets
to shards; ``plan`` lists the pieces each window is copied from, learning a shard's
segment bounds only when the reader opens that shard. A window that straddles a shard
or segment boundary is just a window of several pieces.

    >>> plan(np.array([3]), 3, [0, 4, 10], lambda i: [[0, 2, 4], [4, 10]][i])
    [Piece(window=0, out=0, shard=0, seg=1, lo=1, n=1), Piece(window=0, out=1, shard=1, seg=0, lo=0, n=2)]
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Callable, NamedTuple

import numpy as np

from lmdata.errors import LmdataError
from lmdata.store.protocol import ShardInfo


def shard_bounds(shards: list[ShardInfo]) -> np.ndarray:
    """Segment bounds of a split's shards, checking that they tile the stream in order."""
    bounds = [0]
    for s in shards:
        if s.first_token != bounds[-1]:
            raise LmdataError(
                f"manifest: shard {s.name} starts at token {s.first_token}, expected {bounds[-1]}; "
                "the manifest is corrupt (re-ingest with --overwrite)"
            )
        bounds.append(bounds[-1] + s.n_tokens)
    return np.array(bounds, dtype=np.int64)


def check_windows(starts: np.ndarray, length: int, n_tokens: int) -> np.ndarray:
    """``starts`` as int64, refusing windows outside ``[0, n_tokens)``."""
    starts = np.asarray(starts, dtype=np.int64).reshape(-1)
    if length < 1:
        raise ValueError(f"window length must be >= 1, got {length}")
    if len(starts) and (starts.min() < 0 or starts.max() + length > n_tokens):
        bad = starts[(starts < 0) | (starts + length > n_tokens)][0]
        raise IndexError(f"window [{bad}, {bad + length}) is outside the stream of {n_tokens} tokens")
    return starts


def concat_ranges(first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``concatenate([arange(f, f + c) for f, c in zip(first, count)])`` without a Python loop.

    >>> concat_ranges(np.array([5, 0]), np.array([2, 3]))
    array([5, 6, 0, 1, 2])
    """
    first, count = np.asarray(first, dtype=np.int64), np.asarray(count, dtype=np.int64)
    return np.repeat(first - np.cumsum(count) + count, count) + np.arange(count.sum())


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of a short array, without its overhead (~4 us, not ~18).

    >>> sorted_unique(np.array([3, 1, 3, 2]))
    array([1, 2, 3])
    """
    values = np.sort(values)
    keep = np.empty(len(values), dtype=bool)
    keep[:1] = True
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


class Segments:
    """Consecutive segments of a stream, given by their start offsets plus the stream's end."""

    def __init__(self, bounds: np.ndarray) -> None:
        self.bounds = np.asarray(bounds, dtype=np.int64)  # [n_segments + 1], bounds[-1] = n_tokens
        assert self.bounds.ndim == 1 and len(self.bounds) >= 1
        assert np.all(np.diff(self.bounds) >= 0), "segment bounds must not decrease"

    @property
    def n_tokens(self) -> int:
        return int(self.bounds[-1])

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def locate(self, offsets: np.ndarray) -> np.ndarray:
        """Index of the segment holding each offset (empty segments are skipped)."""
        return np.searchsorted(self.bounds, offsets, side="right") - 1

    def check_windows(self, starts: np.ndarray, length: int) -> np.ndarray:
        return check_windows(starts, length, self.n_tokens)


class Piece(NamedTuple):
    """Copy ``n`` tokens from offset ``lo`` of segment ``seg`` of ``shard`` to ``out[window, out:]``."""

    window: int
    out: int
    shard: int
    seg: int
    lo: int
    n: int


def plan(starts: np.ndarray, length: int, shard_bounds: list[int], seg_bounds: Callable[[int], list[int]]) -> list[Piece]:
    """The pieces of the windows ``[s, s + length)``, in window order.

    ``shard_bounds``: global start of each shard, then the stream's end (a list: bisect
    on a list is ~10x cheaper than ``np.searchsorted`` on a scalar). ``seg_bounds(i)``:
    global start of each segment of shard ``i``, then the shard's end.
    """
    pieces = []
    for j, s in enumerate(starts.tolist()):
        pos, end = s, s + length
        while pos < end:
            i = bisect_right(shard_bounds, pos) - 1
            bounds = seg_bounds(i)
            g = bisect_right(bounds, pos) - 1
            n = min(end, bounds[g + 1]) - pos
            pieces.append(Piece(j, pos - s, i, g, pos - bounds[g], n))
            pos += n
    return pieces
