"""make_loader: exact batches, rank shares, worker-count invariance, resume, errors."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from toyformat import EOT, FailingReader, ForkUnsafeReader, rank_main, write_tokens

from lmdata.data import TokenDataset, make_loader
from lmdata.data.loader import CompactBatches, EpochSampler, collate_windows
from lmdata.data.permutation import Permutation
from lmdata.errors import LmdataError

L, B = 16, 8


def take(loader, n):
    out = []
    while len(out) < n:
        for batch in loader:
            out.append(batch)
            if len(out) == n:
                break
    return out


def same(a, b):
    return len(a) == len(b) and all(all(torch.equal(x, y) for x, y in zip(p, q)) for p, q in zip(a, b))


@pytest.fixture
def index_tokens(tmp_path):
    """Token t is t itself, so a batch's first column names its samples (k = inputs[:, 0] // L)."""
    return write_tokens(tmp_path / "idx.npy", np.arange(6_401, dtype=np.uint16))


def sample_ids(batches):
    return [int(x) // L for inputs, *_ in batches for x in inputs[:, 0]]


def test_batches_are_contract_windows(reader, tokens):
    loader = make_loader(TokenDataset(reader, L), B, seed=1)
    assert len(loader) == ((len(tokens) - 1) // L) // B
    inputs, targets = next(iter(loader))
    assert inputs.dtype == targets.dtype == torch.int64 and inputs.shape == targets.shape == (B, L)
    assert inputs.is_contiguous() and targets.is_contiguous()  # .view(-1) works, as a loss needs
    for row_in, row_t in zip(inputs.numpy(), targets.numpy()):
        starts = np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(tokens, L)[::L] == row_in, axis=1))
        k = int(starts[0])
        assert np.array_equal(row_t, tokens[k * L + 1:k * L + L + 1])


def test_epoch_is_a_shuffle_and_epochs_advance(index_tokens):
    ds = TokenDataset(index_tokens, L)
    loader = make_loader(ds, B, seed=3)
    e0 = sample_ids(list(loader))
    assert loader.epoch == 1 and loader.state_dict()["batch"] == 0
    e1 = sample_ids(list(loader))
    n = len(loader) * B
    assert len(set(e0)) == len(e0) == n == len(set(e1)) and e0 != e1 and sorted(e0) != e0
    loader.set_epoch(0)
    assert sample_ids(list(loader)) == e0
    assert sample_ids(list(make_loader(ds, B, seed=3, sampling="sequential")))[:B] == list(range(B))


@pytest.mark.parametrize("workers", [0, 2])
def test_leaving_a_loop_at_an_epochs_last_batch_then_looping_again_starts_the_next_epoch(index_tokens, workers):
    ds = TokenDataset(index_tokens, L)
    loader = make_loader(ds, B, seed=3, num_workers=workers)
    e0 = []
    for batch in loader:  # the training loop stops at its step budget: the epoch's last batch
        e0.append(batch)
        if len(e0) == len(loader):
            break
    assert loader.epoch == 0 and loader.state_dict()["batch"] == len(loader)
    e1 = list(loader)
    reference = make_loader(ds, B, seed=3)
    assert same(e0, list(reference)) and same(e1, list(reference))
    assert loader.epoch == 2


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_rank_shares_disjoint_and_covering(index_tokens, world_size):
    ds = TokenDataset(index_tokens, L)  # 400 samples
    shares = []
    for rank in range(world_size):
        loader = make_loader(ds, B, rank=rank, world_size=world_size, seed=9, drop_last=False)
        shares.append(sample_ids(list(loader)))
    per_rank = len(ds) // world_size
    assert all(len(s) == per_rank for s in shares)
    flat = [k for s in shares for k in s]
    assert len(set(flat)) == len(flat) == per_rank * world_size


@pytest.mark.parametrize("n", [1001, 4096])
def test_sampler_shares_cover_the_permutation(n):
    world, bs = 4, 10
    seen = []
    for rank in range(world):
        s = EpochSampler(n, bs, seed=2, rank=rank, world_size=world, sampling="sequential-shuffle", drop_last=False)
        seen += [i for b in s for i in b]
    assert len(seen) == len(set(seen)) == (n // world) * world


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), batch=st.integers(1, 64), world=st.integers(1, 6), seed=st.integers(0, 2**40),
       epoch=st.integers(0, 100), drop_last=st.booleans(), start=st.integers(0, 50))
def test_sampler_properties(n, batch, world, seed, epoch, drop_last, start):
    samplers = [EpochSampler(n, batch, seed=seed, rank=r, world_size=world, sampling="sequential-shuffle",
                             drop_last=drop_last) for r in range(world)]
    shares = []
    for s in samplers:
        s.epoch = epoch
        batches = list(s)
        assert len(batches) == s.batches_per_epoch and all(len(b) <= batch for b in batches)
        assert all(len(b) == batch for b in batches) or not drop_last
        s.start = min(start, len(batches))
        assert list(s) == batches[s.start:]  # resuming at batch b is the tail, computed directly
        fresh = EpochSampler(n, batch, seed=seed, rank=s.rank, world_size=world, sampling="sequential-shuffle",
                             drop_last=drop_last)
        fresh.epoch, fresh.start = epoch, s.start
        assert list(fresh) == batches[s.start:]  # a fresh sampler's first block starts mid-block
        flat_share = [i for b in batches for i in b]
        assert flat_share == Permutation(n, seed, epoch)(np.arange(len(flat_share)) * world + s.rank).tolist()
        shares.append(flat_share)
    flat = [i for share in shares for i in share]
    assert len(set(flat)) == len(flat) and all(0 <= i < n for i in flat)  # disjoint
    assert len({len(share) for share in shares}) == 1  # equal shares
    if not drop_last:
        assert len(flat) == (n // world) * world  # covering, minus the remainder


@pytest.mark.parametrize("sampling", ["sequential-shuffle", "random"])
def test_worker_count_does_not_change_batches(reader, sampling):
    ds = TokenDataset(reader, L)
    runs = [take(make_loader(ds, B, num_workers=w, seed=5, sampling=sampling), 12) for w in (0, 1, 2)]
    assert same(runs[0], runs[1]) and same(runs[0], runs[2])


class Uint16Reader:
    """The fixture's reader, declaring a uint16 store (as the built-in formats do)."""

    dtype = np.dtype(np.uint16)

    def __init__(self, inner):
        self.inner, self.n_tokens = inner, inner.n_tokens

    def windows(self, starts, length):
        return self.inner.windows(starts, length).astype(np.uint16)


@pytest.mark.parametrize("doc_info", [None, "positions"])
def test_workers_hand_over_the_store_dtype(reader, doc_info):
    ds = TokenDataset(Uint16Reader(reader), L, doc_info=doc_info, eot_id=EOT)
    assert ds.token_dtype == np.uint16 and TokenDataset(reader, L).token_dtype == np.int64
    handed = CompactBatches(ds).__getitems__([3, 0, 7])
    windows, info = handed if doc_info else (handed, None)
    assert windows.dtype == np.uint16 and (info is None or info.dtype == np.int32)
    want = ds.__getitems__([3, 0, 7])
    assert np.array_equal(windows, want[0] if doc_info else want)
    wide = TokenDataset(reader, L, doc_info=doc_info, eot_id=EOT)  # int64 all the way
    runs = [take(make_loader(d, B, num_workers=w, seed=2), 6) for d, w in ((wide, 0), (ds, 0), (ds, 2))]
    assert same(runs[0], runs[1]) and same(runs[0], runs[2])


@given(st.integers(1, 5), st.integers(1, 9), st.sampled_from([np.uint16, np.uint32, np.int64]))
def test_collate_widens_any_dtype(b, length, dtype):
    windows = np.random.default_rng(b).integers(0, np.iinfo(np.uint16).max, (b, length + 1)).astype(dtype)
    info = np.arange(b * length, dtype=np.int32).reshape(b, length)
    inputs, targets, got_info = collate_windows((windows, info))
    assert inputs.dtype == targets.dtype == got_info.dtype == torch.int64
    assert np.array_equal(inputs.numpy(), windows[:, :-1]) and np.array_equal(targets.numpy(), windows[:, 1:])
    assert np.array_equal(got_info.numpy(), info)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("workers", [0, 2])
def test_pin_memory_on_cuda_gives_pinned_batches(reader, workers):
    ds = TokenDataset(Uint16Reader(reader), L, doc_info="positions", eot_id=EOT)
    pinned = take(make_loader(ds, B, num_workers=workers, pin_memory=True, seed=3), 6)
    plain = take(make_loader(ds, B, num_workers=workers, seed=3), 6)
    assert same(pinned, plain) and all(t.is_pinned() for batch in pinned for t in batch)
    on_device = [t.to("cuda", non_blocking=True) for t in pinned[-1]]
    torch.cuda.synchronize()
    assert all(torch.equal(d.cpu(), t) for d, t in zip(on_device, pinned[-1]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback without an accelerator")
def test_pin_memory_without_accelerator_warns_and_loads(reader):
    with pytest.warns(UserWarning, match="pin_memory"):
        loader = make_loader(TokenDataset(reader, L), B, pin_memory=True)
    inputs, _ = next(iter(loader))
    assert inputs.shape == (B, L) and not inputs.is_pinned()


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_per_read_changes_nothing(reader, workers):
    """Reading several batches per call: the same batches, order, short last batch and resume points."""
    ds = TokenDataset(reader, L, doc_info="positions", eot_id=EOT)
    kw = dict(seed=4, drop_last=False, num_workers=workers)
    ref = take(make_loader(ds, 24, batches_per_read=1, **kw), 60)  # 52 batches + one of 2 an epoch
    assert [len(b[0]) for b in ref[50:55]] == [24, 24, 2, 24, 24]
    for group in (3, 4):
        assert same(take(make_loader(ds, 24, batches_per_read=group, **kw), 60), ref)
        first = make_loader(ds, 24, batches_per_read=group, **kw)
        assert same(take(first, 5), ref[:5])  # stops inside a read of 3 or 4 batches
        fresh = make_loader(ds, 24, batches_per_read=group, **kw)
        fresh.load_state_dict(first.state_dict())
        assert same(take(fresh, 10), ref[5:15])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("k", [0, 5, 15])
def test_resume_mid_epoch(reader, workers, k):
    ds = TokenDataset(reader, L, doc_info="positions", eot_id=EOT)
    m = 9  # 1250 samples / 64 = 19 batches an epoch: k = 15 resumes across the epoch boundary
    full = take(make_loader(ds, 64, num_workers=workers, seed=7), k + m)
    first = make_loader(ds, 64, num_workers=workers, seed=7)
    assert same(take(first, k), full[:k])
    state = first.state_dict()
    fresh = make_loader(ds, 64, num_workers=workers, seed=123)  # the seed comes from the state
    fresh.load_state_dict(state)
    assert same(take(fresh, m), full[k:k + m])


def test_resume_after_break_in_same_loader(reader):
    ds = TokenDataset(reader, L)
    full = take(make_loader(ds, B, num_workers=2, seed=1), 10)
    loader = make_loader(ds, B, num_workers=2, seed=1)
    got = take(loader, 4) + take(loader, 6)  # second iter() continues where the first stopped
    assert same(got, full)


def test_resume_is_o1(reader, monkeypatch):
    ds = TokenDataset(reader, L)
    loader = make_loader(ds, B, seed=1, batches_per_read=3)
    loader.load_state_dict({**loader.state_dict(), "batch": 100})
    calls = []
    original = EpochSampler.batch
    monkeypatch.setattr(EpochSampler, "batch", lambda self, e, b: calls.append(b) or original(self, e, b))
    next(iter(loader))
    assert calls == [100]  # the first read's one batch (EpochSampler.reads), nothing before it


@given(st.integers(1, 60), st.integers(1, 5), st.integers(0, 70), st.integers(1, 4))
@settings(max_examples=200, deadline=None)
def test_reads_cover_the_epoch_once_the_first_alone(n_batches, group, start, batch_size):
    """The first read of a pass holds one batch (a fresh loader's first batch waits for 32 windows, not
    128), the rest ``group``; together they are the batches from ``start`` to the end, each once."""
    s = EpochSampler(n_batches * batch_size, batch_size, seed=0, rank=0, world_size=1, sampling="sequential",
                     drop_last=True, group=group)
    s.start = start
    reads = list(s.reads())
    covered = [b for first, n in reads for b in range(first, first + n)]
    assert covered == list(range(start, n_batches))
    assert len(s) == len(reads) == len(list(s))
    if reads:
        assert reads[0][1] == 1 and all(n == group for _, n in reads[1:-1])


def test_state_mismatch_is_an_error(reader):
    ds = TokenDataset(reader, L)
    state = make_loader(ds, B).state_dict()
    with pytest.raises(LmdataError, match="drop_last"):
        make_loader(ds, B, drop_last=False).load_state_dict(state)
    with pytest.raises(LmdataError, match="version"):
        make_loader(ds, B).load_state_dict({**state, "version": 99})
    # another world size or batch size resumes (tests/data/test_elastic_resume.py)


def test_random_sampling_deterministic_and_resumable(reader, tokens):
    ds = TokenDataset(reader, L)
    full = take(make_loader(ds, B, sampling="random", seed=2), 8)
    assert same(full, take(make_loader(ds, B, sampling="random", seed=2), 8))
    assert not same(full, take(make_loader(ds, B, sampling="random", seed=3), 8))
    first = make_loader(ds, B, sampling="random", seed=2)
    take(first, 3)
    fresh = make_loader(ds, B, sampling="random", seed=2, num_workers=1)
    fresh.load_state_dict(first.state_dict())
    assert same(take(fresh, 5), full[3:])
    windows = np.lib.stride_tricks.sliding_window_view(tokens, L + 1)
    for inputs, targets in full[:2]:
        for x, y in zip(inputs.numpy(), targets.numpy()):
            row = np.concatenate([x, y[-1:]])
            assert np.any(np.all(windows == row, axis=1))


@pytest.mark.parametrize("workers", [0, 1])
def test_reader_error_in_worker_names_the_sample(tmp_path, tokens, workers):
    path = tmp_path / "t.npy"
    np.save(path, tokens)
    ds = TokenDataset(FailingReader(path, bad=L * 500 + 3), L)
    loader = make_loader(ds, 4, num_workers=workers, sampling="sequential", start_method="forkserver")
    with pytest.raises(LmdataError, match=r"sample 500 .*tokens-00000.bin") as info:
        take(loader, 200)
    assert "\n" not in str(info.value)


def test_dead_worker_raises_naming_the_batch(tmp_path, tokens):
    path = tmp_path / "t.npy"
    np.save(path, tokens)
    ds = TokenDataset(FailingReader(path, bad=L * 40 + 1, die=True), L)
    loader = make_loader(ds, 4, num_workers=1, sampling="sequential", timeout=60, batches_per_read=1)
    with pytest.raises(LmdataError, match=r"exited unexpectedly.*reading samples \[40, 41, 42, 43\]"):
        take(loader, 50)
    loader = make_loader(ds, 4, num_workers=1, sampling="sequential", timeout=60)  # reads: batch 0, then 1-4, ...
    with pytest.raises(LmdataError, match=r"batch 9; .*reading samples \[36, 37, .*\.\.\. \(16 in all\)"):
        take(loader, 50)


@pytest.mark.parametrize("start_method", ["fork", None])
def test_fork_unsafe_reader_gets_forkserver(reader, start_method):
    ds = TokenDataset(ForkUnsafeReader(reader.path), L)
    assert not ds.fork_safe
    want = take(make_loader(ds, B, seed=4), 3)
    if start_method == "fork":
        with pytest.warns(UserWarning, match="not fork-safe"):
            loader = make_loader(ds, B, seed=4, num_workers=1, start_method=start_method)
    else:
        loader = make_loader(ds, B, seed=4, num_workers=1, start_method=start_method)
    assert loader._dl.multiprocessing_context.get_start_method() == "forkserver"
    assert same(take(loader, 3), want)


def test_bad_arguments(reader):
    ds = TokenDataset(reader, L)
    with pytest.raises(LmdataError, match="sampling"):
        make_loader(ds, B, sampling="shuffle")
    with pytest.raises(LmdataError, match="no full batch"):
        make_loader(ds, len(ds) + 1)
    with pytest.raises(LmdataError, match="rank"):
        make_loader(ds, B, rank=2, world_size=2)


def test_two_ranks_under_spawn_no_duplicates(tmp_path):
    path = tmp_path / "idx.npy"
    np.save(path, np.arange(6_401, dtype=np.uint16))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, 2, str(path), str(tmp_path / "pg"), L, B, str(tmp_path / f"r{r}")))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    shares = [json.loads((tmp_path / f"r{r}").read_text()) for r in range(2)]
    assert len(shares[0]) == len(shares[1]) == (400 // 2 // B) * B
    assert not set(shares[0]) & set(shares[1])


def test_loader_state_of_another_version_is_refused(reader):
    loader = make_loader(TokenDataset(reader, L), B, num_workers=0, seed=1)
    state = loader.state_dict() | {"version": 999}
    with pytest.raises(LmdataError, match="version"):
        make_loader(TokenDataset(reader, L), B, num_workers=0, seed=1).load_state_dict(state)


@pytest.mark.parametrize("seq_len", [10.5, "16", True, 0, -3])
def test_a_seq_len_that_is_not_a_whole_positive_number_is_refused(reader, seq_len):
    """10.5 had been read as 10, silently."""
    with pytest.raises(LmdataError, match=f"seq_len must be a whole number >= 1, got {seq_len!r}"):
        TokenDataset(reader, seq_len)
    assert TokenDataset(reader, np.int64(16)).seq_len == 16


def test_a_state_saved_over_other_data_is_refused_even_with_the_same_sample_count(reader):
    """Only the sample count had been compared: a state of another split, seq_len or mixture resumed
    silently on other data."""
    from lmdata.data import MixedDataset

    a, b = TokenDataset(reader, 2000), TokenDataset(reader, 1900)  # 20,011 tokens: 10 samples each
    assert len(a) == len(b) == 10
    state = make_loader(a, 2, seed=1).state_dict()
    with pytest.raises(LmdataError, match=r"loader state was saved over other data \(20011 tokens as windows of "
                                          r"2000\); this loader reads 20011 tokens as windows of 1900"):
        make_loader(b, 2, seed=1).load_state_dict(state)
    make_loader(TokenDataset(reader, 2000), 2, seed=1).load_state_dict(state)  # the same data: resumes
    legacy = {k: v for k, v in state.items() if k != "data"}  # a state saved before it was recorded
    make_loader(b, 2, seed=1).load_state_dict(legacy)

    half = write_tokens(Path(reader.path).with_name("half.npy"), np.arange(10_000, dtype=np.uint16))
    mix = MixedDataset([(TokenDataset(reader, L), 0.7), (TokenDataset(half, L), 0.3)], seed=0, n_samples=64)
    other = MixedDataset([(TokenDataset(reader, L), 0.3), (TokenDataset(half, L), 0.7)], seed=0, n_samples=64)
    with pytest.raises(LmdataError, match="loader state was saved over other data"):
        make_loader(other, B).load_state_dict(make_loader(mix, B).state_dict())
