"""A store ingested from the shipped data/sample.txt, shared by the training tests (session scope).

BPE vocabulary 512 (small, so the tiny model's head is cheap), memmap only, the last 6
documents held out as split `validation` -- built through the real `lmdata` commands.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lmdata.cli import main

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample.txt"


def build_sample_store(root: Path) -> Path:
    tok, store = root / "tokenizer", root / "store"
    main(["tokenizer", "train", str(SAMPLE), "--vocab-size", "512", "--out", str(tok), "--workers", "1", "--no-progress"])
    main(["ingest", "--input", str(SAMPLE), "--tokenizer", str(tok), "--out", str(store), "--format", "memmap",
          "--holdout", "6", "--workers", "1", "--no-progress"])
    return store


@pytest.fixture(scope="session")
def sample_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sample_store(tmp_path_factory.mktemp("sample"))


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """One intra-op thread: on a shared 2-core machine, two spinning OpenMP threads per
    test process make timings erratic (10x); results do not depend on it."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
