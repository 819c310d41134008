"""windows.plan: the pieces of every window tile it exactly, whatever the segment layout."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.store.windows import plan


@settings(max_examples=100, deadline=None)
@given(
    layout=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=5), min_size=1, max_size=5),
    data=st.data(),
)
def test_pieces_rebuild_the_windows(layout, data):
    sizes = [[n for n in shard] for shard in layout]
    n_tokens = sum(map(sum, sizes))
    if n_tokens == 0:
        return
    shard_bounds = np.concatenate([[0], np.cumsum([sum(s) for s in sizes])]).tolist()
    seg_bounds = [(shard_bounds[i] + np.concatenate([[0], np.cumsum(s)])).tolist() for i, s in enumerate(sizes)]
    stream = np.arange(n_tokens)
    length = data.draw(st.integers(1, n_tokens))
    starts = np.array(data.draw(st.lists(st.integers(0, n_tokens - length), max_size=6)), dtype=np.int64)
    out = np.full((len(starts), length), -1)
    for p in plan(starts, length, shard_bounds, lambda i: seg_bounds[i]):
        assert p.n > 0 and seg_bounds[p.shard][p.seg] + p.lo + p.n <= seg_bounds[p.shard][p.seg + 1]
        base = seg_bounds[p.shard][p.seg]
        out[p.window, p.out : p.out + p.n] = stream[base + p.lo : base + p.lo + p.n]
    np.testing.assert_array_equal(out, stream[starts[:, None] + np.arange(length)].reshape(len(starts), length))
