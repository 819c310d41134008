"""Raw token files read with positional reads: nothing mapped, lost files named or remade."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from lmdata.errors import LmdataError
from lmdata.io.descriptors import descriptors
from lmdata.store import open_store


def _expected(syn, starts, length):
    return syn.stream[starts[:, None] + np.arange(length)]


def _starts(syn, n=200, length=1025, seed=0):
    return np.random.default_rng(seed).integers(0, len(syn.stream) - length, size=n)


@pytest.mark.parametrize("compiled", [True, False], ids=["C", "python"])
@pytest.mark.parametrize("fmt", ["memmap", "parquet"])
def test_windows_map_nothing_and_hold_no_descriptor_per_shard(make_store, fmt, compiled, monkeypatch):
    """The same windows whether the C reader is built or not (an install without a compiler)."""
    from lmdata.store.formats import raw_windows

    if not compiled:
        monkeypatch.setattr(raw_windows, "read_windows", None)
        monkeypatch.setattr(raw_windows, "preads", None)
    syn = make_store([fmt], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", fmt)
    starts = _starts(syn)
    for verify_pass in range(2):  # the first checks every block it reads, the second reads checked blocks
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    with open("/proc/self/maps") as fh:
        assert not [line for line in fh if ".bin" in line]  # no shard or decoded copy is mapped
    assert len(descriptors().fds) <= descriptors().size


def test_a_memmap_shard_removed_under_the_reader_is_an_error_naming_it(make_store):
    syn = make_store(["memmap"])
    reader = open_store(syn.path).reader("train", "memmap")
    starts = _starts(syn, n=8)
    reader.windows(starts, 1025)
    descriptors().close_all()  # its descriptor is gone too (as after the pool evicted it)
    for f in (syn.path / "train" / "memmap").glob("tokens-*.bin"):
        f.unlink()
    with pytest.raises(LmdataError, match=r"tokens-\d+\.bin: shard \d+.*went missing.*lmdata verify"):
        reader.windows(starts, 1025)


def test_a_decoded_parquet_copy_evicted_under_the_reader_is_decoded_again(make_store):
    syn = make_store(["parquet"])
    reader = open_store(syn.path).reader("train", "parquet")
    starts = _starts(syn, n=64)
    reader.windows(starts, 1025)
    descriptors().close_all()
    copies = list(Path(os.environ["LMDATA_CACHE_DIR"]).rglob("*.bin"))
    assert copies
    for f in copies:  # another process's eviction
        f.unlink()
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert list(Path(os.environ["LMDATA_CACHE_DIR"]).rglob("*.bin"))  # made again


def test_readers_in_threads_read_their_own_windows(make_store):
    syn = make_store(["memmap"], shard_tokens=1_000)
    store, errors = open_store(syn.path), []

    def read(seed):
        reader = store.reader("train", "memmap")
        try:
            for k in range(20):
                starts = _starts(syn, n=32, length=257, seed=seed * 100 + k)
                np.testing.assert_array_equal(reader.windows(starts, 257), _expected(syn, starts, 257))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
