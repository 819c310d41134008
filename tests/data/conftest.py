"""Fixtures of the data tests (the toy reader lives in toyformat.py, importable by spawned workers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from toyformat import NpyReader, make_tokens, write_tokens


@pytest.fixture
def tokens() -> np.ndarray:
    return make_tokens(20_011)


@pytest.fixture
def reader(tmp_path: Path, tokens: np.ndarray) -> NpyReader:
    return write_tokens(tmp_path / "tokens.npy", tokens)
