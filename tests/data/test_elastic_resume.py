"""Elastic resume: a loader state saved by rank 0 of a W-rank run, loaded by every rank of a
W'-rank run, continues the one global order (nothing read twice, nothing skipped but a
drop-last epoch end's remainder)."""

from __future__ import annotations

import numpy as np
import pytest
from toyformat import write_tokens

from lmdata.data import TokenDataset, make_loader
from lmdata.data.mixed import MixedDataset
from lmdata.data.permutation import Permutation
from lmdata.errors import LmdataError

L, B = 16, 8


@pytest.fixture(params=["split", "mixture"])
def dataset(request, tmp_path):
    """Token t is t itself; the mixture draws two such streams (the second offset by 20,000)."""
    ds = TokenDataset(write_tokens(tmp_path / "a.npy", np.arange(6_401, dtype=np.uint16)), L)
    if request.param == "split":
        return ds
    other = TokenDataset(write_tokens(tmp_path / "b.npy", np.arange(20_000, 23_201, dtype=np.uint16)), L)
    return MixedDataset([(ds, 0.7), (other, 0.3)], seed=5, n_samples=450)


def rows(batches) -> list[tuple[int, ...]]:
    """Each sequence of ``batches`` as the tuple of its input ids (the window identifies the sample)."""
    return [tuple(row.tolist()) for inputs, *_ in batches for row in inputs]


def take(loader, n: int) -> list:
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def global_order(ds, seed: int, lo: int, hi: int, sampling: str = "sequential-shuffle") -> list[tuple[int, ...]]:
    """The sequences at global positions ``lo .. hi - 1`` of epoch 0 (what one process reads there)."""
    idx = np.arange(lo, hi)
    if sampling == "sequential-shuffle":
        idx = Permutation(len(ds), seed, 0)(idx)
    return [tuple(np.asarray(ds[int(i)])[:-1].tolist()) for i in idx]


@pytest.mark.parametrize("new_world", [1, 3])
@pytest.mark.parametrize("workers", [0, 1])
def test_rank0_state_of_two_ranks_resumes_under_any_world_size(dataset, new_world, workers):
    seed, k = 11, 5
    old = [make_loader(dataset, B, rank=r, world_size=2, seed=seed) for r in range(2)]
    before = [rows(take(loader, k)) for loader in old]
    assert sorted(before[0] + before[1]) == sorted(global_order(dataset, seed, 0, 2 * k * B))  # the first positions
    state = old[0].state_dict()
    assert (state["position"], state["base"], state["batch"]) == (2 * k * B, 0, k)
    new = []
    for r in range(new_world):
        loader = make_loader(dataset, B, rank=r, world_size=new_world, seed=seed, num_workers=workers)
        loader.load_state_dict(state)  # every new rank loads the same (rank 0's) state
        new.append(loader)
    after = [rows(list(loader)) for loader in new]  # the rest of epoch 0
    assert all(loader.epoch == 1 for loader in new)
    read = [r for part in before + after for r in part]
    end = 2 * k * B + len(after[0]) * new_world
    assert len({len(a) for a in after}) == 1  # equal shares
    assert sorted(read) == sorted(global_order(dataset, seed, 0, end))  # nothing twice, nothing skipped ...
    assert len(dataset) - end < (B + 1) * new_world  # ... but the drop-last remainder


@pytest.mark.parametrize("sampling", ["sequential", "random"])
def test_other_samplings_resume_elastically(tmp_path, sampling):
    ds = TokenDataset(write_tokens(tmp_path / "a.npy", np.arange(6_401, dtype=np.uint16)), L)
    single = rows(take(make_loader(ds, B, seed=2, sampling=sampling), 9))  # 72 sequences of one process
    old = [make_loader(ds, B, rank=r, world_size=2, seed=2, sampling=sampling) for r in range(2)]
    before = [rows(take(loader, 2)) for loader in old]
    new = [make_loader(ds, B, rank=r, world_size=4, seed=2, sampling=sampling) for r in range(4)]
    for loader in new:
        loader.load_state_dict(old[0].state_dict())
    after = [rows(take(loader, 1)) for loader in new]
    # one process's order, position by position: rank r of W read positions i*W + r
    interleaved = [part[i] for i in range(2 * B) for part in before] + [part[i] for i in range(B) for part in after]
    assert interleaved == single[:len(interleaved)]


def test_chained_resumes_and_state_round_trip(tmp_path):
    ds = TokenDataset(write_tokens(tmp_path / "a.npy", np.arange(6_401, dtype=np.uint16)), L)
    seed, read = 4, []
    loaders = [make_loader(ds, B, rank=r, world_size=2, seed=seed) for r in range(2)]
    for world in (3, 1, 2):
        read += [r for loader in loaders for r in rows(take(loader, 3))]
        state = loaders[0].state_dict()
        loaders = [make_loader(ds, B, rank=r, world_size=world, seed=seed) for r in range(world)]
        for loader in loaders:
            loader.load_state_dict(state)
        again = make_loader(ds, B, rank=0, world_size=world, seed=seed)
        again.load_state_dict(loaders[0].state_dict())  # a resumed loader's own state resumes it
        assert again.state_dict() == loaders[0].state_dict()
    assert sorted(read) == sorted(global_order(ds, seed, 0, len(read)))


def test_state_saved_at_an_epoch_end_starts_the_next_epoch(tmp_path):
    ds = TokenDataset(write_tokens(tmp_path / "a.npy", np.arange(6_401, dtype=np.uint16)), L)  # 400 samples
    old = make_loader(ds, B, rank=0, world_size=2, seed=1)
    take(old, len(old))  # 25 batches: positions 0 .. 399, nothing left
    new = make_loader(ds, B, rank=0, world_size=3, seed=1)
    new.load_state_dict(old.state_dict())
    assert new.state_dict()["epoch"] == 1 and new.state_dict()["position"] == 0


def test_version_1_state_still_loads(tmp_path):
    ds = TokenDataset(write_tokens(tmp_path / "a.npy", np.arange(6_401, dtype=np.uint16)), L)
    full = rows(take(make_loader(ds, B, rank=1, world_size=2, seed=3), 7))
    v1 = {"version": 1, "epoch": 0, "batch": 4, "seed": 3, "sampling": "sequential-shuffle", "batch_size": B,
          "rank": 1, "world_size": 2, "n_samples": len(ds), "drop_last": True}  # what lmdata wrote before
    same = make_loader(ds, B, rank=1, world_size=2, seed=3)
    same.load_state_dict(v1)
    assert rows(take(same, 3)) == full[4 * B:]
    elastic = make_loader(ds, B, seed=3)
    elastic.load_state_dict(v1)
    assert elastic.state_dict()["position"] == 4 * B * 2


def test_states_of_another_dataset_or_order_are_refused(tmp_path):
    ds = TokenDataset(write_tokens(tmp_path / "a.npy", np.arange(6_401, dtype=np.uint16)), L)
    state = make_loader(ds, B).state_dict()
    with pytest.raises(LmdataError, match="n_samples"):
        make_loader(TokenDataset(ds.reader, L * 2), B).load_state_dict(state)
    with pytest.raises(LmdataError, match="sampling"):
        make_loader(ds, B, sampling="random").load_state_dict(state)
    with pytest.raises(LmdataError, match="position"):
        make_loader(ds, B).load_state_dict({**state, "position": len(ds) + 1})


def test_len_is_a_whole_epochs_batches_after_any_resume(dataset):
    """After an elastic resume len() had counted only the rest of the resumed epoch (54 of 79), after a same-size
    one the whole epoch's (158): one meaning now, torch's."""
    seed = 3
    state = take_state = make_loader(dataset, B, rank=0, world_size=2, seed=seed)
    take(take_state, 5)
    state = take_state.state_dict()
    for world in (2, 4):
        fresh = make_loader(dataset, B, rank=0, world_size=world, seed=seed)
        whole_epoch = len(fresh)
        fresh.load_state_dict(state)
        assert len(fresh) == whole_epoch
        assert len(list(fresh)) < whole_epoch and len(fresh) == whole_epoch == len(list(fresh))  # the next one: whole


def test_set_epoch_takes_whole_numbers_only(dataset):
    loader = make_loader(dataset, B, seed=0)
    for bad in (2.5, "1", True, None, -1):
        with pytest.raises(LmdataError, match=r"set_epoch\(.*\): give a whole number >= 0"):
            loader.set_epoch(bad)
    loader.set_epoch(np.int64(2))
    assert loader.epoch == 2
