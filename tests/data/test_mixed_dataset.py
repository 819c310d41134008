"""MixedDataset: deterministic weighted mixing, fast-converging proportions, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from toyformat import EOT, make_tokens, write_tokens

from lmdata.data import MixedDataset, TokenDataset, make_loader
from lmdata.errors import LmdataError

L = 16


@pytest.fixture
def sources(tmp_path):
    """Three splits with disjoint token ranges, so a window tells its source: t // 1000."""
    out = []
    for i, n in enumerate([3_001, 8_001, 1_601]):
        tokens = (make_tokens(n, seed=i, vocab=900) + 1000 * i).astype(np.uint16)
        out.append(TokenDataset(write_tokens(tmp_path / f"s{i}.npy", tokens), L))
    return out


def test_locate_and_read(sources):
    mix = MixedDataset([(sources[0], 1.0), (sources[1], 2.0), (sources[2], 1.0)], seed=3)
    assert len(mix) == sum(len(d) for d in sources)
    idx = [5, 0, len(mix) - 1, 17, 5]
    src, local = mix.locate(idx)
    batch = mix.__getitems__(idx)
    assert batch.shape == (5, L + 1)
    for row, s, j in zip(batch, src, local):
        assert np.array_equal(row, sources[s][j])
        assert row[0] // 1000 == s


def test_proportions_converge_fast(sources):
    weights = [0.5, 0.3, 0.2]
    mix = MixedDataset(list(zip(sources, weights)), seed=0, n_samples=100_000)
    src, _ = mix.locate(np.arange(len(mix)))
    for k in [10, 100, 1000, 10_000, 100_000]:
        counts = np.bincount(src[:k], minlength=3)
        assert np.all(np.abs(counts - k * np.array(weights)) <= 3), (k, counts)  # tree depth bound
    assert mix.counts == np.bincount(src, minlength=3).tolist()


@settings(max_examples=20, deadline=None)
@given(weights=st.lists(st.floats(0.01, 100), min_size=1, max_size=6), n=st.integers(1, 2000), seed=st.integers(0, 2**32))
def test_schedule_is_a_bijection_onto_source_slots(weights, n, seed):
    lens = [300] * len(weights)

    class Fake:  # sizes only: locate() never reads
        seq_len, doc_info = L, None

        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

    mix = MixedDataset([(Fake(m), w) for m, w in zip(lens, weights)], seed=seed, n_samples=n)
    src, _ = mix.locate(np.arange(n))
    counts = np.bincount(src, minlength=len(weights))
    assert counts.tolist() == mix.counts and counts.sum() == n
    depth = max(1, int(np.ceil(np.log2(len(weights))))) if len(weights) > 1 else 0
    want = n * np.array(weights) / sum(weights)
    assert np.all(np.abs(counts - want) <= depth + 1 + n * 2 ** -20)


def test_small_source_repeats_with_fresh_shuffles(sources):
    small = sources[2]  # 100 samples
    mix = MixedDataset([(sources[0], 1.0), (small, 1.0)], seed=1, n_samples=800)
    src, local = mix.locate(np.arange(800))
    picks = local[src == 1]
    assert len(picks) == 400
    passes = picks.reshape(4, 100)
    assert all(sorted(p.tolist()) == list(range(100)) for p in passes)
    assert not np.array_equal(passes[0], passes[1])


def test_deterministic_from_seed(sources):
    a = MixedDataset([(sources[0], 1.0), (sources[1], 1.0)], seed=5).locate(np.arange(500))
    b = MixedDataset([(sources[0], 1.0), (sources[1], 1.0)], seed=5).locate(np.arange(500))
    c = MixedDataset([(sources[0], 1.0), (sources[1], 1.0)], seed=6).locate(np.arange(500))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[1], c[1])


@pytest.mark.parametrize("workers", [0, 2])
def test_mixture_loader_resumes(sources, workers):
    mix = MixedDataset([(sources[0], 0.6), (sources[1], 0.3), (sources[2], 0.1)], seed=2)
    full = []
    loader = make_loader(mix, 8, num_workers=workers, seed=4)
    for batch in loader:
        full.append(batch)
        if len(full) == 12:
            break
    first = make_loader(mix, 8, num_workers=workers, seed=4)
    it = iter(first)
    for _ in range(5):
        next(it)
    fresh = make_loader(mix, 8, num_workers=workers, seed=4)
    fresh.load_state_dict(first.state_dict())
    got = [b for _, b in zip(range(7), fresh)]
    assert all(torch.equal(x, y) for g, f in zip(got, full[5:]) for x, y in zip(g, f))


def test_mixture_epoch_proportions(sources):
    weights = [0.6, 0.3, 0.1]
    mix = MixedDataset(list(zip(sources, weights)), seed=2, n_samples=1000)
    seen = [int(x) // 1000 for inputs, _ in make_loader(mix, 10, seed=1) for x in inputs[:, 0]]
    assert np.all(np.abs(np.bincount(seen, minlength=3) - 1000 * np.array(weights)) <= 3)


def test_doc_info_passes_through(tmp_path):
    t = make_tokens(2_000)
    a = TokenDataset(write_tokens(tmp_path / "a.npy", t), L, doc_info="positions", eot_id=EOT)
    b = TokenDataset(write_tokens(tmp_path / "b.npy", t[::-1].copy()), L, doc_info="positions", eot_id=EOT)
    mix = MixedDataset([(a, 1), (b, 1)])
    windows, pos = mix.__getitems__([0, 1, 2, 3])
    src, local = mix.locate([0, 1, 2, 3])
    for i in range(4):
        w, p = (a, b)[src[i]][local[i]]
        assert np.array_equal(windows[i], w) and np.array_equal(pos[i], p)


def test_bad_mixtures(sources, tmp_path):
    with pytest.raises(LmdataError, match="weights"):
        MixedDataset([(sources[0], 0.0), (sources[1], 1.0)])
    for bad in ([float("inf"), float("inf")], [float("inf"), 1.0], [float("nan"), 1.0], [1e308, 1e308]):
        with pytest.raises(LmdataError, match="weights"):  # inf + inf was a ValueError from round(nan)
            MixedDataset([(sources[0], bad[0]), (sources[1], bad[1])])
    other = TokenDataset(sources[0].reader, L + 1)
    with pytest.raises(LmdataError, match="seq_len"):
        MixedDataset([(sources[0], 1.0), (other, 1.0)])
    with pytest.raises(LmdataError, match="random"):
        make_loader(MixedDataset([(sources[0], 1.0)]), 4, sampling="random")


def test_compact_batch_for_the_loader(sources):
    """The loader reads a mixture in its widest source dtype; the ids are those of the int64 read."""

    class Uint32Dataset:  # a source holding uint32 ids, without ``batch``
        token_dtype, seq_len, doc_info = np.dtype(np.uint32), L, None

        def __len__(self):
            return 50

        def __getitems__(self, idx):
            return (np.asarray(idx)[:, None] + np.arange(L + 1) + 70_000).astype(np.int64)

    for d in sources:
        d.token_dtype = np.dtype(np.uint16)  # what a uint16 store's reader declares
    mix = MixedDataset([(sources[0], 1.0), (sources[1], 1.0)], seed=1)
    assert mix.token_dtype == np.uint16
    idx = list(range(0, 40, 3))
    got = mix.batch(idx, dtype=mix.token_dtype)
    assert got.dtype == np.uint16 and np.array_equal(got, mix.__getitems__(idx))
    wide = MixedDataset([(sources[0], 1.0), (Uint32Dataset(), 1.0)], seed=1)
    assert wide.token_dtype == np.uint32
    got = wide.batch(idx, dtype=wide.token_dtype)
    assert got.dtype == np.uint32 and np.array_equal(got, wide.__getitems__(idx)) and got.max() >= 70_000


def test_a_mixture_of_stores_from_different_tokenizers_is_refused(reader):
    """The CLI's --mix checked it; MixedDataset itself (the README's mixture) had mixed ids of two vocabularies."""
    a, b = TokenDataset(reader, 16), TokenDataset(reader, 16)
    a.tokenizer_hash, b.tokenizer_hash = "sha256:aaa", "sha256:bbb"
    with pytest.raises(LmdataError, match=r"MixedDataset sources come from different tokenizers \(sha256:aaa, "
                                          r"sha256:bbb\); mix stores ingested with the same tokenizer"):
        MixedDataset([(a, 0.5), (b, 0.5)])
    b.tokenizer_hash = "sha256:aaa"
    MixedDataset([(a, 0.5), (b, np.float32(0.5))])


@pytest.mark.parametrize("sources, said", [
    (lambda a: [a, a], "MixedDataset needs \\(dataset, weight\\) pairs"),
    (lambda a: [(a, "0.3"), (a, 0.7)], "MixedDataset weight '0.3': give a number"),
    (lambda a: [(a, True), (a, 0.7)], "MixedDataset weight True: give a number"),
])
def test_malformed_sources_are_named(reader, sources, said):
    with pytest.raises(LmdataError, match=said):
        MixedDataset(sources(TokenDataset(reader, 16)))


def test_indices_and_counts_must_be_whole_numbers(reader):
    """ds[1.5], mix[1.5] and n_samples=2.5 had been truncated silently."""
    ds = TokenDataset(reader, 16)
    mix = MixedDataset([(ds, 0.5), (TokenDataset(reader, 16), 0.5)], n_samples=8)
    for data, what in ((ds, "sample"), (mix, "mixture")):
        for bad in (1.5, "3", True):
            with pytest.raises(IndexError, match=f"{what} indices must be integers"):
                data[bad]
    assert np.array_equal(ds[np.int32(2)], ds[2]) and np.array_equal(mix[np.uint8(3)], mix[3])
    for kw in (dict(n_samples=2.5), dict(seed=1.7), dict(seed="1")):
        with pytest.raises(LmdataError, match="give a whole number"):
            MixedDataset([(ds, 1.0)], **kw)


def test_sources_of_batch_at_an_epochs_end_and_before_any_batch(sources):
    """It had asked for batch -1 once the state moved on to the next epoch (IndexError), and before any batch."""
    mix = MixedDataset(list(zip(sources, (0.5, 0.3, 0.2))), seed=1, n_samples=40)
    loader = make_loader(mix, 8, seed=2)
    with pytest.raises(LmdataError, match="has handed out no batch since it was made"):
        mix.sources_of_batch(loader)
    for inputs, _ in loader:
        last = inputs
    counts = mix.sources_of_batch(loader)
    assert counts.sum() == len(last) and loader.state_dict()["batch"] == 0


def test_sources_of_batch_after_an_elastic_resume_counts_the_batch_handed_out(sources):
    """The rollback to the previous epoch's last batch used the next epoch's base: an elastically resumed epoch's
    last batch was counted from another base (it reported [5, 3, 0] of a batch that held [4, 2, 2])."""
    mix = MixedDataset(list(zip(sources, (0.5, 0.3, 0.2))), seed=1, n_samples=200)
    first = make_loader(mix, 8, seed=2)
    for _, _ in zip(range(3), first):
        pass
    loader = make_loader(mix, 8, seed=2, rank=0, world_size=2)
    loader.load_state_dict(first.state_dict())
    with pytest.raises(LmdataError, match="no batch since"):
        mix.sources_of_batch(loader)
    for inputs, _ in loader:  # the rest of the elastic epoch
        last = inputs
    want = np.bincount([int(row[0]) // 1000 for row in last.numpy()], minlength=3)
    assert mix.sources_of_batch(loader).tolist() == want.tolist()
