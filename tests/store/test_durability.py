"""Writers: few fsyncs per shard, and a rewritten shard never keeps a stale completion record."""

from __future__ import annotations

import os

import numpy as np
import pytest

from lmdata.store.formats import base
from lmdata.store.registry import get_format

# file fsyncs per fresh shard: memmap tokens + docs + record; Parquet file + record;
# Lance fragment + sidecar + record. Directories are fsynced once per ``finish``.
PER_SHARD = {"memmap": 4, "parquet": 2, "lance": 3}


@pytest.mark.parametrize("fmt", sorted(PER_SHARD))
def test_fsyncs_per_shard(tmp_path, monkeypatch, fmt):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    writer = get_format(fmt).writer(tmp_path / "train" / fmt, np.dtype(np.uint16))
    tokens = np.arange(300, dtype=np.uint16)
    shards = [writer.write_shard(i, tokens, np.array([0, 100, 300]), 2 * i, 300 * i) for i in range(4)]
    assert len(calls) == 4 * PER_SHARD[fmt]
    writer.finish(shards)
    assert sorted(writer.completed()) == [0, 1, 2, 3]


@pytest.mark.parametrize("fmt", sorted(PER_SHARD))
def test_rewriting_a_shard_replaces_its_record(tmp_path, fmt):
    fdir = tmp_path / "train" / fmt
    writer = get_format(fmt).writer(fdir, np.dtype(np.uint16))
    old = writer.write_shard(0, np.full(300, 7, dtype=np.uint16), np.array([0, 300]), 0, 0)
    assert base.forget(fdir, 0).to_json() == old.to_json()
    assert writer.completed() == {}  # the record is gone before any file of the shard changes
    new = writer.write_shard(0, np.full(300, 9, dtype=np.uint16), np.array([0, 300]), 0, 0)
    new = writer.write_shard(0, np.full(300, 5, dtype=np.uint16), np.array([0, 300]), 0, 0)  # names exist: rewrite path
    assert writer.completed()[0].to_json() == new.to_json()
    writer.finish([new])
    r = get_format(fmt).reader(fdir, [new], np.dtype(np.uint16))
    assert (r.windows(np.array([0]), 300) == 5).all()
