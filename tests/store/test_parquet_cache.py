"""Parquet shards decoded once per machine: what the loader reads, and what it refuses."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from lmdata.errors import LmdataError
from lmdata.store import open_store
from lmdata.store.formats.parquet import encode_shard, row_doc_starts


def _windows(store, n=64, length=65, seed=0):
    reader = open_store(store).reader("train", "parquet")
    starts = np.random.default_rng(seed).integers(0, reader.n_tokens - length, size=n)
    return reader, starts, reader.windows(starts, length)


def test_windows_come_from_one_decoded_copy_per_shard_shared_by_readers(sample_store, tmp_path, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    memmap = open_store(sample_store).reader("train", "memmap")
    reader, starts, got = _windows(sample_store)
    np.testing.assert_array_equal(got, memmap.windows(starts, 65))
    copies = sorted((tmp_path / "cache" / "parquet").glob("*/*.bin"))
    touched = set(np.searchsorted(reader._shard_bounds, starts, side="right") - 1)
    assert len(copies) == len(touched) and all((c.parent / (c.name + ".crc")).is_file() for c in copies)
    mtimes = [c.stat().st_mtime_ns for c in copies]
    _, _, again = _windows(sample_store)  # another reader (another process would be the same): no new decode
    np.testing.assert_array_equal(again, got)
    assert all(c.stat().st_mtime_ns >= m for c, m in zip(copies, mtimes))
    assert len(list((tmp_path / "cache").rglob("*.bin"))) == len(copies)


def test_a_copys_crcs_are_kept_once(sample_store, tmp_path, monkeypatch):
    """Once in the reader's flat CRC array, a copy's CRCs are not also kept per shard (memory: a split's
    size / 1,024 per process); a failing block reads them again from the copy's sidecar."""
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    reader = open_store(sample_store).reader("train", "parquet")
    reader.windows(np.array([0]), 65)  # its first batch: no copy on the machine yet (shard 0 decoded)
    other, starts, got = _windows(sample_store, n=256)  # another reader makes the copies
    np.testing.assert_array_equal(reader.windows(starts, 65), got)  # this one opens them one by one
    fast = [i for i in range(len(reader.shards)) if reader._mode[i] == 1 and i in reader._copy_keys]
    assert fast and not any(i in reader._copy_sums for i in fast)


def test_a_copy_evicted_before_its_crcs_were_read_is_made_again(sample_store, tmp_path, monkeypatch):
    """A copy opened without its sidecar (a batch's first touch) and evicted by another process before a
    check needed its CRCs: made again, not a bare FileNotFoundError."""
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    _, starts, got = _windows(sample_store, n=256)  # the machine's copies made
    from lmdata.io.descriptors import descriptors

    descriptors().close_all()  # (the other reader's descriptors: this one opens its own)
    reader = open_store(sample_store).reader("train", "parquet")
    reader._first_touch([0], sums=False)
    assert reader._sources[0] is not None and 0 not in reader._copy_sums
    for f in (tmp_path / "cache" / "parquet").rglob("*.bin*"):  # another process's eviction
        f.unlink()
    reader._copied_sums(0)
    np.testing.assert_array_equal(reader.windows(starts, 65), got)


def test_eviction_removes_what_killed_writers_left(sample_store, tmp_path, monkeypatch):
    """A worker ended by os._exit mid-copy leaves a temporary file (and maybe a sidecar whose copy was never
    renamed into place): uncounted by the budget, they are removed once untouched for an hour."""
    import os
    import time

    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    reader, starts, got = _windows(sample_store)
    copy = next((tmp_path / "cache" / "parquet").glob("*/*.bin"))
    old_temp = copy.with_name(f".{copy.name}.tmp-999999")
    new_temp = copy.with_name(f".{copy.name}.tmp-999998")
    lone_sidecar = copy.with_name("f" * 64 + "-x-u2.bin.crc")
    for path in (old_temp, new_temp, lone_sidecar):
        path.write_bytes(b"partial")
    hour_ago = time.time() - 7200
    for path in (old_temp, lone_sidecar):
        os.utime(path, (hour_ago, hour_ago))
    reader.copies.evict()
    assert not old_temp.exists() and not lone_sidecar.exists()
    assert new_temp.exists()  # maybe being written right now
    assert copy.exists() and (copy.parent / (copy.name + ".crc")).exists()  # within the budget: kept
    np.testing.assert_array_equal(reader.windows(starts, 65), got)


def test_with_the_cache_off_shards_are_decoded_into_memory(sample_store, tmp_path, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LMDATA_PARQUET_CACHE_BYTES", "0")
    memmap = open_store(sample_store).reader("train", "memmap")
    reader, starts, got = _windows(sample_store)
    np.testing.assert_array_equal(got, memmap.windows(starts, 65))
    assert not (tmp_path / "cache").exists() and reader.copies is None


def test_a_damaged_decoded_copy_is_decoded_again(sample_store, tmp_path, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    _, starts, got = _windows(sample_store)
    for copy in (tmp_path / "cache" / "parquet").glob("*/*.bin"):
        data = bytearray(copy.read_bytes())
        data[len(data) // 2] ^= 0xFF
        copy.write_bytes(bytes(data))
    _, _, again = _windows(sample_store)
    np.testing.assert_array_equal(again, got)


def test_a_damaged_copy_whose_replacement_is_damaged_too_is_named(sample_store, tmp_path, monkeypatch):
    """The copy made again after a failed block is checked too: a second failure names the block (another
    process wrote the new copy here, from a disk that flips a bit the same way)."""
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    first = open_store(sample_store).reader("train", "parquet")
    first.windows(np.array([s.first_token for s in first.shards]), 10)  # every shard's copy made

    def damage(copy):
        data = bytearray(copy.read_bytes())
        data[len(data) // 2] ^= 0xFF
        copy.write_bytes(bytes(data))

    saved = {c: (c.read_bytes(), Path(str(c) + ".crc").read_bytes())
             for c in (tmp_path / "cache" / "parquet").glob("*/*.bin")}
    for copy in saved:
        damage(copy)
    reader = open_store(sample_store).reader("train", "parquet")
    drop = reader.copies.drop

    def dropped_then_rewritten_damaged(path):  # another process makes the copy again, damaged as before
        drop(path)
        copy = next(c for c in saved if str(c) == str(path))
        Path(str(copy) + ".crc").write_bytes(saved[copy][1])  # its CRCs (of the right bytes), then the bytes
        copy.write_bytes(saved[copy][0])
        damage(copy)

    monkeypatch.setattr(reader.copies, "drop", dropped_then_rewritten_damaged)
    middle = np.array([reader.shards[0].n_tokens // 2 - 10])  # the damaged byte is in shard 0's middle block
    with pytest.raises(LmdataError, match="CRC"):
        reader.windows(middle, 20)


def _swap_two_tokens(path, size):
    """The shard rewritten as another valid Parquet file of the same size and layout: two tokens
    swapped, page CRCs recomputed by the writer (what a page check cannot see). Tries pairs until
    the zstd output has the original size."""
    table = pq.read_table(path)
    doc_id, offset = (table.column(c).to_numpy() for c in ("doc_id", "token_offset"))
    values = table.column("tokens").combine_chunks().values.to_numpy()
    doc_starts = row_doc_starts(doc_id, offset - offset[0], len(values))
    for i in np.flatnonzero(values[1:] != values[:-1])[:300].tolist():
        swapped = values.copy()
        swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
        data = b"".join(encode_shard(swapped, doc_starts, int(doc_id[0]), int(offset[0])))
        if len(data) == size:
            path.write_bytes(data)
            return
    pytest.skip("no swap of two tokens kept the file's size (the size check refuses every other)")


def test_a_same_size_valid_parquet_file_with_other_tokens_is_refused(sample_store, tmp_path, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    store = tmp_path / "store"
    shutil.copytree(sample_store, store)
    shard = open_store(store).manifest.splits["train"].formats["parquet"][0]
    path = store / "train" / "parquet" / shard.files[0].path
    _swap_two_tokens(path, path.stat().st_size)
    size_only = open_store(store).reader("train", "parquet", verify="size")
    with pytest.raises(LmdataError, match=f"shard {shard.name} fails its xxh128"):  # the copy would be every reader's
        size_only.windows(np.array([0]), 65)
    assert not list((tmp_path / "cache").rglob("*.bin"))
    reader = open_store(store).reader("train", "parquet")
    with pytest.raises(LmdataError, match=f"shard {shard.name} fails its xxh128"):
        reader.windows(np.array([0]), 65)
    with pytest.raises(LmdataError, match="xxh128"):
        open_store(store).document("train", 0, format="parquet")


def test_a_cache_that_cannot_be_written_decodes_into_memory_with_a_warning(sample_store, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(blocker / "cache"))  # makedirs fails, even as root
    memmap = open_store(sample_store).reader("train", "memmap")
    with pytest.warns(RuntimeWarning, match="cannot keep copies of parquet shards here"):
        reader, starts, got = _windows(sample_store, n=256)
    assert np.array_equal(got, memmap.windows(starts, 65))
    assert reader._in_memory > 0 and not (blocker / "cache").exists()


def test_a_decoded_shard_owns_its_tokens_the_pool_is_released_and_a_flipped_page_refused(sample_store,
                                                                                          monkeypatch):
    """``decoded_tokens``: the column's values, in an array NumPy owns (so the pool's buffers can go),
    the pool's unused memory handed back after every decode, failed or not; page CRCs checked."""
    import pyarrow as pa

    from lmdata.store.formats import parquet

    path = sorted((sample_store / "train" / "parquet").glob("*.parquet"))[0]
    raw = path.read_bytes()
    want = pq.ParquetFile(path).read(columns=["tokens"]).column(0).combine_chunks().flatten().to_numpy()
    real, released = pa.default_memory_pool(), []

    class Pool:
        def release_unused(self):
            released.append(True)
            real.release_unused()

    monkeypatch.setattr(pa, "default_memory_pool", lambda: Pool())
    got = parquet.decoded_tokens(raw, np.dtype(np.uint16))
    assert got.dtype == np.uint16 and got.flags.owndata and np.array_equal(got, want)
    assert released == [True]
    data = bytearray(raw)
    data[len(data) // 3] ^= 0x01  # inside a data page
    with pytest.raises(OSError):
        parquet.decoded_tokens(bytes(data), np.dtype(np.uint16))
    assert released == [True, True]
