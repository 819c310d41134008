"""bench/linked_store.py: a store K times another, its shards hard links; read back as the stream K times over."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:  # as when a bench runs: its folder is on sys.path
    sys.path.insert(0, str(ROOT / "bench"))

from linked_store import linked_store  # noqa: E402

from lmdata.store import open_store  # noqa: E402


def test_the_linked_store_reads_as_the_source_stream_k_times_and_shares_its_files(sample_store, tmp_path):
    source = tmp_path / "src"
    shutil.copytree(sample_store, source)  # (the fixture's store is shared: its folder is not ours to add to)
    out = linked_store(source, 3)
    assert out == tmp_path / "src-linked-x3" and linked_store(source, 3) == out  # made once
    one = open_store(source).reader("train", "memmap")
    three = open_store(out).reader("train", "memmap")
    n = one.n_tokens
    assert three.n_tokens == 3 * n and len(three.shards) == 3 * len(one.shards)
    stream = one.windows(np.array([0]), n)[0]
    starts = np.array([0, n - 50, n + 7, 2 * n + 100, 3 * n - 64])
    np.testing.assert_array_equal(three.windows(starts, 64), np.tile(stream, 3)[starts[:, None] + np.arange(64)])
    first = source / "train" / "memmap" / one.shards[0].files[0].path
    linked = out / "train" / "memmap" / three.shards[len(one.shards)].files[0].path
    assert os.stat(first).st_ino == os.stat(linked).st_ino  # one file, not a copy
    assert "memmap" in open_store(out).manifest.splits["train"].formats
