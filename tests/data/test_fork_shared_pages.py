"""Forked workers start with the parent's objects frozen out of the cyclic GC, so their
collections do not copy the parent's pages; the parent itself stays unfrozen."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from toyformat import FreezeRecordingReader, make_tokens

from lmdata.data import TokenDataset, make_loader
from lmdata.data.workers import gc_frozen_for_fork


def recorded(tmp_path, workers, start_method=None):
    path, out = tmp_path / "t.npy", tmp_path / "seen"
    out.mkdir()
    np.save(path, make_tokens(4_000))
    loader = make_loader(TokenDataset(FreezeRecordingReader(path, out), 16), 4, num_workers=workers,
                         start_method=start_method, persistent_workers=False)
    for _ in zip(range(3), loader):
        pass
    return {int(p.name): int(p.read_text()) for p in out.iterdir()}


@pytest.fixture
def unfrozen():
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()


def test_forked_workers_read_frozen_and_the_parent_is_unfrozen(tmp_path, unfrozen):
    seen = recorded(tmp_path, 2, "fork")
    assert len(seen) == 2 and all(count > 0 for count in seen.values())
    assert gc.get_freeze_count() == 0


def test_no_workers_freezes_nothing(tmp_path, unfrozen):
    assert recorded(tmp_path, 0) == {os.getpid(): 0}


def test_a_caller_that_froze_keeps_its_freeze(tmp_path, unfrozen):
    gc.freeze()
    before = gc.get_freeze_count()
    recorded(tmp_path, 2, "fork")
    assert 0.9 * before < gc.get_freeze_count() <= before  # neither unfrozen nor frozen further (frees lower it)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_only_fork_freezes(method, unfrozen):
    import multiprocessing as mp

    with gc_frozen_for_fork(2, mp.get_context(method)):
        assert gc.get_freeze_count() == 0
    with gc_frozen_for_fork(2, mp.get_context("fork")):
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
