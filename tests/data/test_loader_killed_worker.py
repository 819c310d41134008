"""A DataLoader worker killed with SIGKILL (issue 19, case 6): the error names the samples it
held -- the read it was in and the reads queued for it -- not "none recorded"."""

from __future__ import annotations

import numpy as np
import pytest
from toyformat import SiblingKillerReader

from lmdata.data import TokenDataset, make_loader
from lmdata.errors import LmdataError

L, B = 16, 4


def test_sigkilled_worker_names_the_samples_it_held(tmp_path):
    path = tmp_path / "t.npy"
    np.save(path, np.arange(6_401, dtype=np.uint16))
    (tmp_path / "pids").mkdir()
    # reads alternate: worker 0 reads batches 0, 2, ..., worker 1 batches 1, 3, ...; worker 0 kills
    # worker 1 while reading batch 2, when worker 1 is inside batch 1 with batch 3 queued for it
    reader = SiblingKillerReader(path, trigger=2 * B * L + 1, pid_dir=tmp_path / "pids")
    loader = make_loader(TokenDataset(reader, L), B, num_workers=2, prefetch=2, sampling="sequential",
                         batches_per_read=1, start_method="fork", timeout=60)
    with pytest.raises(LmdataError) as info:
        for _ in loader:
            pass
    text = str(info.value)
    assert "\n" not in text and "none recorded" not in text
    assert "worker 1 was reading samples [4, 5, 6, 7] and held samples [12, 13, 14, 15] queued for it" in text


def test_a_worker_killed_while_the_caller_computes_is_reported_at_the_next_batch(tmp_path):
    """torch's SIGCHLD handler raised the death inside the caller's training step (a traceback far
    from the loader, naming no samples); now the next batch reports it, naming them."""
    import os
    import signal
    import time

    from toyformat import NpyReader

    path = tmp_path / "t.npy"
    np.save(path, np.arange(6_401, dtype=np.uint16))
    loader = make_loader(TokenDataset(NpyReader(path), L), B, num_workers=2, prefetch=2, sampling="sequential",
                         batches_per_read=1, start_method="fork", timeout=60)
    it = iter(loader)
    next(it)
    workers = loader._dl._iterator._workers
    os.kill(workers[1].pid, signal.SIGKILL)
    time.sleep(1.0)  # the caller's "training step": the death must not be raised in here
    with pytest.raises(LmdataError) as info:
        for _ in it:
            pass
    text = str(info.value)
    assert "\n" not in text and "is killed by signal" in text and "worker 1 " in text
