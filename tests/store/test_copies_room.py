"""The machine's copies of shards and the disk they live on (``parquet_cache.DecodedShards``): room
made before a write eats into the disk's free part, a full disk evicts and tries again, a cache
that cannot be written stops being tried, and copies read for hours stay marked used."""

from __future__ import annotations

import errno
import os
import time
from collections import namedtuple

import numpy as np
import pytest

from lmdata.io import cache
from lmdata.store import open_store
from lmdata.store.formats.parquet_cache import DecodedShards

TOKENS = 4096  # a copy: 8 KiB of uint16
DTYPE = np.dtype(np.uint16)


def _copies(tmp_path, n: int) -> tuple[DecodedShards, list[str]]:
    """``n`` copies, the first the least recently used."""
    copies = DecodedShards(tmp_path / "cache", 1 << 30)
    keys = [f"{k:02x}" * 8 for k in range(n)]
    for age, key in enumerate(keys):
        path = copies.put(key, DTYPE, np.full(TOKENS, age, DTYPE))
        os.utime(path, (time.time() - 1000 + age, time.time() - 1000 + age))
    return copies, keys


def _here(copies: DecodedShards, keys: list[str]) -> list[bool]:
    return [copies.get(key, DTYPE, TOKENS * 2) is not None for key in keys]


def test_a_write_that_would_eat_into_the_disks_free_part_evicts_the_least_recently_used_first(tmp_path, monkeypatch):
    copies, keys = _copies(tmp_path, 4)
    _short_by(monkeypatch, int(1.5 * TOKENS * 2), copies)  # a copy and a half short: two evicted
    assert copies.put("ff" * 8, DTYPE, np.zeros(TOKENS, DTYPE)) is not None
    assert _here(copies, keys) == [False, False, True, True]
    _short_by(monkeypatch, -1, copies)  # room: none evicted
    assert copies.put("ee" * 8, DTYPE, np.zeros(TOKENS, DTYPE)) is not None
    assert _here(copies, keys) == [False, False, True, True]


def _first_write_fails(copies: DecodedShards, monkeypatch, code: int) -> list:
    """The first write of a copy fails with ``code``, the next ones write: the writes tried, listed."""
    real, calls = copies._write, []

    def write(path, tokens):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(code, os.strerror(code))
        real(path, tokens)

    monkeypatch.setattr(copies, "_write", write)
    return calls


def test_a_full_disk_evicts_half_the_copies_and_tries_again(tmp_path, monkeypatch):
    copies, keys = _copies(tmp_path, 4)
    calls = _first_write_fails(copies, monkeypatch, errno.ENOSPC)
    assert copies.put("ff" * 8, DTYPE, np.ones(TOKENS, DTYPE)) is not None
    assert len(calls) == 2 and _here(copies, keys) == [False, False, True, True]
    assert np.array_equal(np.fromfile(copies.get("ff" * 8, DTYPE, TOKENS * 2), DTYPE), np.ones(TOKENS, DTYPE))
    assert copies.writable


def test_a_cache_that_stays_full_is_not_tried_again(tmp_path, monkeypatch):
    copies, _ = _copies(tmp_path, 2)

    def full(path, tokens):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(copies, "_write", full)
    with pytest.warns(RuntimeWarning, match="cannot keep copies of parquet shards here"):
        assert copies.put("ff" * 8, DTYPE, np.ones(TOKENS, DTYPE)) is None
    assert not copies.writable


def _short_by(monkeypatch, nbytes: int, copies: DecodedShards | None = None) -> None:
    """The disk: ``nbytes`` short of the tenth kept free once a copy is written; with ``copies``, its
    free space grows as they are evicted."""
    monkeypatch.setenv(cache.KEEP_FREE_ENV, "0.1")
    usage = namedtuple("usage", "total used free")
    held = copies.size() if copies is not None else 0
    base = 100_000 + TOKENS * 2 - nbytes + held

    def disk_usage(_):
        free = base - (copies.size() if copies is not None else 0)
        return usage(1_000_000, 1_000_000 - free, free)

    monkeypatch.setattr(cache.shutil, "disk_usage", disk_usage)


def test_a_disk_that_evicting_every_copy_would_not_free_enough_keeps_its_copies(tmp_path, monkeypatch):
    copies, keys = _copies(tmp_path, 2)
    _short_by(monkeypatch, 3 * TOKENS * 2)  # three copies' worth: the cache holds two
    with pytest.warns(RuntimeWarning, match="the disk is nearly full"):
        assert copies.put("ff" * 8, DTYPE, np.ones(TOKENS, DTYPE)) is None
    assert _here(copies, keys) == [True, True] and copies.writable  # nothing evicted; the next copy tries again


def test_a_read_only_cache_is_memory_not_an_error(tmp_path, monkeypatch):
    """Making room on a read-only filesystem (its copies cannot be removed) is the in-memory path too."""
    copies, keys = _copies(tmp_path, 2)
    _short_by(monkeypatch, TOKENS)

    def read_only(path):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(copies, "drop", read_only)
    with pytest.warns(RuntimeWarning, match="cannot keep copies"):
        assert copies.put("ff" * 8, DTYPE, np.ones(TOKENS, DTYPE)) is None
    assert not copies.writable


def test_a_passing_error_skips_one_copy_and_tries_the_next(tmp_path, monkeypatch):
    copies, _ = _copies(tmp_path, 1)
    _first_write_fails(copies, monkeypatch, errno.EMFILE)
    with pytest.warns(RuntimeWarning, match="Too many open files"):
        assert copies.put("ff" * 8, DTYPE, np.ones(TOKENS, DTYPE)) is None
    assert copies.writable
    assert copies.put("ee" * 8, DTYPE, np.ones(TOKENS, DTYPE)) is not None


def test_a_reader_that_cannot_keep_copies_stops_making_them(sample_store, tmp_path, monkeypatch):
    """One failed write: the reader decodes the rest into memory without trying the cache for each shard."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(blocker / "cache"))  # makedirs fails, even as root
    reader = open_store(sample_store).reader("train", "parquet")
    writes = []
    real = reader.copies._write
    monkeypatch.setattr(reader.copies, "_write", lambda *a: (writes.append(a), real(*a)))
    with pytest.warns(RuntimeWarning, match="cannot keep copies"):
        reader.windows(np.array([0]), 65)  # one shard: one write tried
    starts = np.arange(0, reader.n_tokens - 65, 997)  # every shard
    got = reader.windows(starts, 65)
    assert np.array_equal(got, open_store(sample_store).reader("train", "memmap").windows(starts, 65))
    assert len(reader.shards) > 1 and len(writes) == 1


def test_copies_read_for_hours_are_marked_used_again(sample_store, tmp_path, monkeypatch):
    """A copy read through a mapping was used last when it was opened: every ``USED_EVERY_S`` a reader
    marks the copies it reads used, so eviction takes the ones nobody reads first."""
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    reader = open_store(sample_store).reader("train", "parquet")
    starts = np.arange(0, reader.n_tokens - 65, 499)
    reader.windows(starts, 65)
    copies = sorted((tmp_path / "cache" / "parquet").glob("*/*.bin"))
    assert len(copies) == len(reader.shards) > 1
    day_ago = time.time() - 86_400
    for c in copies:
        os.utime(c, (day_ago, day_ago))
    reader.windows(starts, 65)
    assert all(c.stat().st_mtime < day_ago + 1 for c in copies)  # not at every batch
    reader._used_due = 0.0  # USED_EVERY_S later
    reader.windows(starts[:4], 65)
    assert all(c.stat().st_mtime > time.time() - 600 for c in copies)
    for c in copies:  # documents read (``lmdata show``) mark them too
        os.utime(c, (day_ago, day_ago))
    reader._used_due = 0.0
    reader.document(0)
    assert all(c.stat().st_mtime > time.time() - 600 for c in copies)


def test_copies_that_cannot_be_written_warn_once(tmp_path, monkeypatch):
    """A batch's write and the background fetches' fail together, each naming another file: one warning."""
    import warnings

    copies, _ = _copies(tmp_path, 1)

    def failing(path, tokens):
        raise OSError(errno.EIO, f"Input/output error: {path}")

    monkeypatch.setattr(copies, "_write", failing)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for key in ("aa", "bb", "cc"):
            assert copies.put(key * 8, DTYPE, np.ones(TOKENS, DTYPE)) is None
    assert [str(w.message).count("cannot keep copies") for w in seen] == [1]


def test_a_shard_whose_copy_cannot_be_written_is_fetched_once_for_its_batch(sample_store, tmp_path, monkeypatch):
    """The batch's prefetch keeps the tokens it could not copy for the batch: one decode, not two."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(blocker / "cache"))
    reader = open_store(sample_store).reader("train", "parquet")
    fetched, real = [], reader._fetch
    monkeypatch.setattr(reader, "_fetch", lambda i: (fetched.append(i), real(i))[1])
    starts = reader._shard_bounds[1:4] - 100  # windows near the ends of shards 0, 1 and 2
    with pytest.warns(RuntimeWarning, match="cannot keep copies"):
        got = reader.windows(starts, 65)
    assert np.array_equal(got, open_store(sample_store).reader("train", "memmap").windows(starts, 65))
    assert sorted(fetched) == [0, 1, 2]  # each shard once (twice before: the prefetch's tokens were dropped)


def test_a_disk_without_room_is_not_listed_again_for_every_copy(tmp_path, monkeypatch):
    """An 11,761-shard `lmdata verify` on a nearly full disk listed every copy for each new one (323 s)."""
    copies, keys = _copies(tmp_path, 2)
    _short_by(monkeypatch, 3 * TOKENS * 2)
    listed = []
    real = copies._by_age
    monkeypatch.setattr(copies, "_by_age", lambda: listed.append(1) or real())
    with pytest.warns(RuntimeWarning, match="the disk is nearly full"):
        for k in range(50):
            assert copies.put(f"{k + 16:02x}" * 8, DTYPE, np.ones(TOKENS, DTYPE)) is None
    assert len(listed) == 1 and _here(copies, keys) == [True, True]
    monkeypatch.setattr(copies, "_no_room_at", copies._no_room_at - 31)  # half a minute on: listed again
    assert copies.put("ff" * 8, DTYPE, np.ones(TOKENS, DTYPE)) is None  # (warned once already)
    assert len(listed) == 2


def test_an_eviction_makes_room_for_more_than_one_copy(tmp_path, monkeypatch):
    """At the disk's limit each copy had listed all the others to evict one."""
    copies, keys = _copies(tmp_path, 32)
    monkeypatch.setenv(cache.KEEP_FREE_ENV, "0.1")
    freed = []  # the disk: half a copy short of the tenth kept free, and what eviction frees, less what is written
    real_drop = copies.drop
    monkeypatch.setattr(copies, "drop", lambda path: freed.append(TOKENS * 2) or real_drop(path))
    written = []
    usage = namedtuple("usage", "total used free")

    def disk_usage(_):
        free = 100_000 + TOKENS * 2 - TOKENS + sum(freed) - sum(written)
        return usage(1_000_000, 1_000_000 - free, free)

    monkeypatch.setattr(cache.shutil, "disk_usage", disk_usage)
    listed = []
    real = copies._by_age
    monkeypatch.setattr(copies, "_by_age", lambda: listed.append(1) or real())
    for k in range(3):
        assert copies.put(f"{k + 64:02x}" * 8, DTYPE, np.zeros(TOKENS, DTYPE)) is not None
        written.append(TOKENS * 2)
    assert len(listed) == 1 and _here(copies, keys)[:2] == [False, False] and all(_here(copies, keys)[4:])
