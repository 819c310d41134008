"""Shared fixtures: one small tokenizer and one sample store per session (kept read-only)."""

from __future__ import annotations

import subprocess
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


@pytest.fixture
def small_fs(tmp_path):
    """``small_fs(size)``: a fresh tmpfs of ``size`` (e.g. "600k") mounted under ``tmp_path``, unmounted after.

    Mounting needs root (or CAP_SYS_ADMIN) and a kernel/container that permits it: where it
    is refused the test is skipped, saying so (issue 19: full-disk tests run where they can).
    """
    mounts: list[Path] = []

    def make(size: str) -> Path:
        point = tmp_path / f"fs-{len(mounts)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a {size} tmpfs here ({done.stderr.strip() or done.returncode}); "
                        "the full-disk test needs root and a kernel that permits tmpfs mounts")
        mounts.append(point)
        return point

    def resize(point: Path, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(point)], check=True)

    make.resize = resize
    yield make
    for point in reversed(mounts):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)
