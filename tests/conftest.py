"""Shared fixtures: one small tokenizer and one sample store per session (kept read-only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from samples import FORMATS, HOLDOUT, SAMPLE, SAMPLE_SHARD_TOKENS

from lmdata.ingest import ingest
from lmdata.sources import SourceSpec


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 512-id BPE trained on the shipped sample (< 1 s)."""
    from lmdata.tokenizer import Tokenizer, train_bpe

    vocab, merges = train_bpe(str(SAMPLE), 512, ["<|endoftext|>"], workers=1)
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    Tokenizer(vocab, merges, ["<|endoftext|>"]).save(out)
    return out


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path):
    from lmdata.tokenizer import Tokenizer

    return Tokenizer.load(tokenizer_dir)


@pytest.fixture(scope="session")
def sample_store(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """data/sample.txt in every format, last 6 documents held out as `validation`. Do not modify."""
    out = tmp_path_factory.mktemp("stores") / "sample"
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, out, formats=FORMATS,
           shard_tokens=SAMPLE_SHARD_TOKENS, workers=1, holdout=("train", "validation", HOLDOUT), progress=False, log=None)
    return out
