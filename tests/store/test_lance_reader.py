"""The Lance reader's two read paths (fragment files, dataset ``take``) serve the same windows."""

from __future__ import annotations

import numpy as np

from lmdata.store import open_store


def test_fragment_file_reads_equal_dataset_takes(make_store):
    syn = make_store(["lance"], n_tokens=30_000, shard_tokens=5_000)
    store = open_store(syn.path)
    direct, via_dataset = store.reader("train", "lance"), store.reader("train", "lance")
    via_dataset.direct = False
    rng = np.random.default_rng(1)
    for _ in range(5):
        starts = rng.integers(0, len(syn.stream) - 700, size=16)
        want = np.stack([syn.stream[s : s + 700] for s in starts])
        np.testing.assert_array_equal(direct.windows(starts, 700), want)
        np.testing.assert_array_equal(via_dataset.windows(starts, 700), want)
    doc = syn.stream[syn.doc_starts[7] : syn.doc_starts[8]]
    np.testing.assert_array_equal(direct.document(7), doc)
    np.testing.assert_array_equal(via_dataset.document(7), doc)


def test_a_small_file_cache_still_reads_every_shard(make_store, monkeypatch):
    from lmdata.store import lance_format

    monkeypatch.setattr(lance_format, "MAX_OPEN_FILES", 2)
    syn = make_store(["lance"], n_tokens=30_000, shard_tokens=4_000)
    r = open_store(syn.path).reader("train", "lance")
    starts = np.arange(0, len(syn.stream) - 500, 1_700)[::-1]  # every shard, in an order that evicts
    np.testing.assert_array_equal(r.windows(starts, 500), np.stack([syn.stream[s : s + 500] for s in starts]))
    assert len(r._files) == 2
