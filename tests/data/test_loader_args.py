"""make_loader's arguments and its one-stream rule: one line naming what is wrong, never a silent guess."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmdata.data import TokenDataset, make_loader
from lmdata.errors import LmdataError

L, B = 16, 4


@pytest.fixture
def ds(reader):
    return TokenDataset(reader, L)


@pytest.mark.parametrize("kw, said", [
    (dict(batch_size=2.5), "make_loader batch_size=2.5: give a whole number >= 1"),
    (dict(batch_size="4"), "make_loader batch_size='4': give a whole number >= 1"),
    (dict(batch_size=True), "make_loader batch_size=True: give a whole number >= 1"),
    (dict(num_workers=1.5), "make_loader num_workers=1.5: give a whole number >= 0"),
    (dict(seed=1.7), "make_loader seed=1.7: give a whole number"),
    (dict(seed=None), "make_loader seed=None: give a whole number"),
    (dict(rank=0.5, world_size=2), "make_loader rank=0.5: give a whole number >= 0"),
    (dict(world_size=2), "world_size=2 without rank: give each process its rank"),
    (dict(start_method="bogus", num_workers=1), "make_loader start_method='bogus': give one of fork, forkserver, spawn"),
])
def test_a_malformed_argument_is_named(ds, kw, said):
    kw = {"batch_size": B, **kw}
    with pytest.raises(LmdataError, match=said.replace("(", r"\(").replace(")", r"\)")):
        make_loader(ds, kw.pop("batch_size"), num_workers=kw.pop("num_workers", 0), **kw)


@pytest.mark.parametrize("not_a_dataset", [None, [1, 2, 3], np.arange(10)])
def test_what_is_not_a_dataset_is_named(not_a_dataset):
    with pytest.raises(LmdataError, match="make_loader dataset: .* is not a dataset with __len__ and __getitems__"):
        make_loader(not_a_dataset, 1)


@pytest.mark.parametrize("workers", [0, 2])
def test_one_iterator_at_a_time(ds, workers):
    """zip(L, L) had handed out every other batch to each (or one batch twice) while the state counted both."""
    loader = make_loader(ds, B, num_workers=workers, seed=0)
    first, second = iter(loader), iter(loader)
    next(first)
    next(second)
    with pytest.raises(LmdataError, match="this loader was iterated afresh"):
        next(first)
    loader = make_loader(ds, B, num_workers=workers, seed=0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    expected = next(iter(_resumed(ds, state)))
    loader.load_state_dict(state)
    with pytest.raises(LmdataError, match="had its state loaded or epoch set"):  # the old iterator is stale now
        next(it)
    assert all(torch.equal(a, b) for a, b in zip(next(iter(loader)), expected))  # a new one resumes the state


def _resumed(ds, state):
    loader = make_loader(ds, B, seed=0)
    loader.load_state_dict(state)
    return loader


def test_set_epoch_and_state_shapes_are_checked(ds):
    loader = make_loader(ds, B)
    with pytest.raises(LmdataError, match=r"set_epoch\(-1\): give a whole number >= 0 \(epochs count from 0\)"):
        loader.set_epoch(-1)
    with pytest.raises(LmdataError, match="loader state must be the dict state_dict\\(\\) returned, not NoneType"):
        loader.load_state_dict(None)


@pytest.mark.parametrize("change", [dict(epoch=None), dict(batch=-3), dict(base="0"), dict(position=1.5)])
def test_a_state_edited_or_cut_short_is_named(ds, change):
    """A missing key had been a bare KeyError; batch=-3 had been taken, failing later mid-iteration."""
    state = make_loader(ds, B).state_dict()
    state.update(change)
    state = {k: v for k, v in state.items() if v is not None}
    key = next(iter(change))
    with pytest.raises(LmdataError, match=f"loader state: {key}=.* \\(it needs epoch, batch, base, position"):
        make_loader(ds, B).load_state_dict(state)


def test_an_empty_format_name_is_refused(sample_store):
    from lmdata.store import open_store

    with pytest.raises(LmdataError, match=r"format='': give a format name \(memmap, "):
        open_store(sample_store).dataset("train", 16, format="")


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("read", [3, 4, 8])  # batches_per_read 4: 4 and 8 stop the first iterator at a read's end
def test_a_stale_iterator_takes_nothing_from_the_live_one(ds, workers, read):
    """With persistent workers the two iterators share torch's: the stale one had taken the live one's next
    read before it raised, and the live one then handed out the read after it under the wrong batch numbers."""
    ref = [x for _, (x, _) in zip(range(read + 3), make_loader(ds, B, num_workers=workers, seed=0))]
    loader = make_loader(ds, B, num_workers=workers, seed=0)
    stale = iter(loader)
    for _ in range(read):
        next(stale)
    live = iter(loader)
    assert torch.equal(next(live)[0], ref[read])
    with pytest.raises(LmdataError, match="iterated afresh"):
        next(stale)
    assert torch.equal(next(live)[0], ref[read + 1]) and torch.equal(next(live)[0], ref[read + 2])
    assert loader.state_dict()["batch"] == read + 3


def test_a_state_loaded_after_an_epochs_last_batch_is_not_ended_by_the_old_loop(ds):
    loader = make_loader(ds, 400, seed=0)
    it = iter(loader)
    for _ in range(len(loader)):
        next(it)
    other = make_loader(ds, 400, seed=0)
    mid = iter(other)
    next(mid)
    state = other.state_dict()
    loader.load_state_dict({**state, "epoch": np.int64(0)})  # NumPy integers load too
    with pytest.raises(LmdataError, match="iterated afresh"):
        next(it)
    assert (loader.state_dict()["epoch"], loader.state_dict()["batch"]) == (0, 1)


def test_a_refused_state_leaves_a_running_iterator_running(ds):
    loader = make_loader(ds, B, seed=0)
    it = iter(loader)
    next(it)
    with pytest.raises(LmdataError):
        loader.load_state_dict({**loader.state_dict(), "n_samples": 1})
    next(it)
    assert loader.state_dict()["batch"] == 2
