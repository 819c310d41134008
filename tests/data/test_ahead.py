"""The 0-worker loader's look-ahead: the next read handed to the check-ahead thread, batches unchanged."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from formats import FORMATS  # noqa: E402
from toyformat import build_store  # noqa: E402

from lmdata.data import make_loader  # noqa: E402
from lmdata.data.ahead import LookAhead  # noqa: E402
from lmdata.data.loader import EpochSampler  # noqa: E402
from lmdata.errors import LmdataError  # noqa: E402
from lmdata.store import open_store  # noqa: E402


def _look_ahead(found):
    reads = [[k] for k in range(20)]
    handed: list[list[int]] = []

    def check(indices):
        handed.append(indices)
        return found

    return list(LookAhead(reads, check)), reads, handed


def test_each_read_is_handed_over_a_group_early_while_jobs_find_work():
    from lmdata.data.ahead import AHEAD, GROUP

    reads, events = [[k] for k in range(60)], []

    def check(indices):
        events.append(("handed", indices[0]))
        return 5

    for read in LookAhead(reads, check):
        events.append(("taken", read[0]))
    assert [k for what, k in events if what == "taken"] == list(range(60))
    assert [k for what, k in events if what == "handed"] == list(range(3, 60))  # from the fourth read on
    taken = 0
    for what, k in events:  # a read handed over before the read ``taken`` goes out: how far ahead of it
        taken += what == "taken"
        if what == "handed":
            assert 0 < k - taken <= AHEAD
            assert k - taken > GROUP or k < 3 + AHEAD  # a group early, after the first hand-over (reads 3-18)


def test_a_failing_hand_over_is_never_the_reads_error():
    reads, handed = [[k] for k in range(10)], []

    def check(indices):
        handed.append(indices)
        raise IndexError("a reader of another package")

    assert list(LookAhead(reads, check)) == reads
    assert handed == [[3]]  # tried once, then no more


def test_jobs_that_find_nothing_are_handed_over_ever_more_rarely():
    out, reads, handed = _look_ahead(found=0)
    assert out == reads
    assert [k for [k] in handed] == [3, 5, 9, 17]  # gaps doubling: a later epoch of a checked store
    _, _, handed = _look_ahead(found=-1)  # no job finished yet: not known to be idle
    assert handed == reads[3:]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(path, token stream) of a store of every built-in format, in 2,000-token shards."""
    path = tmp_path_factory.mktemp("store")
    return path, build_store(path, FORMATS, n_tokens=40_000, shard_tokens=2_000)


@pytest.mark.parametrize("fmt", FORMATS)
def test_batches_and_resume_are_the_same_with_and_without_it(store, fmt, monkeypatch):
    path, stream = store
    ds = open_store(path).dataset("train", 64, format=fmt)

    def batches(loader, n):
        return [x.numpy().copy() for _, (x, _) in zip(range(n), loader)]

    monkeypatch.setenv("LMDATA_CHECK_AHEAD", "0")
    plain = make_loader(ds, 8, num_workers=0, seed=3)
    assert isinstance(plain._dl.batch_sampler, EpochSampler)
    expected = batches(plain, len(plain)) + batches(plain, len(plain))  # two epochs
    monkeypatch.setenv("LMDATA_CHECK_AHEAD", "1")
    ahead = make_loader(ds, 8, num_workers=0, seed=3)
    assert isinstance(ahead._dl.batch_sampler, LookAhead)
    got = batches(ahead, len(ahead)) + batches(ahead, len(ahead))
    assert len(got) == len(expected) and all(np.array_equal(a, b) for a, b in zip(got, expected))
    # and both are the contract's windows
    sampler = EpochSampler(len(ds), 8, seed=3, rank=0, world_size=1, sampling="sequential-shuffle", drop_last=True)
    for b, x in enumerate(got[:len(ahead)]):
        np.testing.assert_array_equal(x, np.stack([stream[k * 64:k * 64 + 64] for k in sampler.batch(0, b)]))
    first = make_loader(ds, 8, num_workers=0, seed=3)
    batches(first, 5)
    resumed = make_loader(ds, 8, num_workers=0, seed=3)
    resumed.load_state_dict(first.state_dict())
    assert np.array_equal(batches(resumed, 1)[0], expected[5])


def test_a_bad_setting_is_one_line_naming_it(store, monkeypatch):
    ds = open_store(store[0]).dataset("train", 64, format="memmap")
    monkeypatch.setenv("LMDATA_CHECK_AHEAD", "yes")
    with pytest.raises(LmdataError, match=r"^LMDATA_CHECK_AHEAD='yes': give 1 .* or 0 "):
        make_loader(ds, 8, num_workers=0)


def _found(loader, n):
    """Read ``n`` batches of ``loader`` (0 workers), each hand-over's job run to its end before the
    read goes on (the thread never loses the race to a read here): the unchecked blocks each job met."""
    from lmdata.io._preads import check_ahead_wait

    sampler, reported = loader._dl.batch_sampler, []
    check = sampler.check

    def check_and_wait(indices):
        found = check(indices)
        reported.append(check_ahead_wait())
        return found

    sampler.check = check_and_wait
    return [x.numpy().copy() for _, (x, _) in zip(range(n), loader)], reported


@pytest.mark.parametrize("fmt", FORMATS)
def test_through_the_loader_the_thread_checks_blocks(store, fmt):
    ds = open_store(store[0]).dataset("train", 64, format=fmt)
    _, reported = _found(make_loader(ds, 4, num_workers=0, seed=5, batches_per_read=2), 12)
    assert max(reported) > 0  # blocks checked on the thread, reported back through the dataset


def test_a_mixture_hands_each_source_its_part(tmp_path, monkeypatch):
    from lmdata.data import MixedDataset

    one, other = tmp_path / "one", tmp_path / "other"  # ~100 blocks each: most of a read's are unchecked
    build_store(one, ["parquet"], n_tokens=200_000, shard_tokens=20_000, seed=3)
    build_store(other, ["memmap"], n_tokens=200_000, shard_tokens=20_000, seed=7)

    def mixture():  # fresh readers each time: no block checked yet
        return MixedDataset([(open_store(one).dataset("train", 64, format="parquet"), 0.6),
                             (open_store(other).dataset("train", 64, format="memmap"), 0.4)], seed=2)

    monkeypatch.setenv("LMDATA_CHECK_AHEAD", "0")  # 80 batches: 20 reads, hand-overs of 8 at reads 3, 11, 19
    expected = [x.numpy().copy() for _, (x, _) in zip(range(80), make_loader(mixture(), 4, num_workers=0, seed=5))]
    monkeypatch.setenv("LMDATA_CHECK_AHEAD", "1")
    loader = make_loader(mixture(), 4, num_workers=0, seed=5)
    assert isinstance(loader._dl.batch_sampler, LookAhead)
    got, reported = _found(loader, 80)
    assert all(np.array_equal(a, b) for a, b in zip(got, expected)) and len(got) == 80
    assert max(reported) > 0


def test_a_mixtures_read_reuses_the_location_its_look_ahead_found(tmp_path, monkeypatch):
    from lmdata.data import MixedDataset

    build_store(tmp_path / "a", ["memmap"], n_tokens=50_000, shard_tokens=5_000, seed=1)
    build_store(tmp_path / "b", ["memmap"], n_tokens=50_000, shard_tokens=5_000, seed=2)
    mix = MixedDataset([(open_store(tmp_path / n).dataset("train", 64, format="memmap"), 0.5) for n in "ab"], seed=4)
    calls = []
    locate = mix.locate
    monkeypatch.setattr(mix, "locate", lambda indices: calls.append(list(indices)) or locate(indices))
    loader = make_loader(mix, 4, num_workers=0, seed=1)
    reads = len(list(loader._dl.batch_sampler.sampler))
    for _ in loader:
        pass
    assert len(calls) == reads  # each read located once: by its look-ahead, or by itself
