"""The training tests share the root conftest's ``sample_store`` (data/sample.txt, vocab 512,
every format, the last 6 documents held out as `validation`) and run torch on one thread."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """One intra-op thread: on a shared 2-core machine, two spinning OpenMP threads per
    test process make timings erratic (10x); results do not depend on it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
