"""Raw token files read out of mappings or with positional reads: the same windows, lost files named or remade."""

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


@pytest.mark.parametrize("fmt", ["memmap", "parquet"])
@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "pread"])
def test_a_split_of_more_than_open_at_once_shards_opens_each_batchs_own(make_store, fmt, mapped, monkeypatch):
    """Past ``OPEN_AT_ONCE`` shards the first batch opens only the shards it reads (opening 100,010 took
    2 s), and each later batch the new ones it meets, in one call: the same windows, every shard checked
    once, a damaged one refused where it is first read."""
    from lmdata.store.formats import raw_windows

    if not mapped:
        _pread_only(monkeypatch)
    monkeypatch.setattr(raw_windows, "OPEN_AT_ONCE", 4)
    syn = make_store([fmt], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", fmt)
    assert len(reader.shards) > 10
    one = np.array([reader.shards[3].first_token + 5])
    np.testing.assert_array_equal(reader.windows(one, 100), _expected(syn, one, 100))
    assert reader._n_sources == 1  # that shard alone
    for seed in range(4):
        starts = _starts(syn, n=8, seed=seed)
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    starts = _starts(syn, n=400, seed=9)
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert reader._n_sources == len(reader.shards)
    assert (reader._mode == 1).all()  # each shard's CRCs loaded, its sidecar's checksum checked
    if fmt == "memmap":
        victim = syn.path / "train" / fmt / reader.shards[-1].files[0].path
        victim.write_bytes(victim.read_bytes()[:-2])
        fresh = open_store(syn.path).reader("train", fmt)
        np.testing.assert_array_equal(fresh.windows(one, 100), _expected(syn, one, 100))  # the others read
        with pytest.raises(LmdataError, match=victim.name):
            fresh.windows(np.array([reader.shards[-1].first_token]), 10)


@pytest.mark.parametrize("compiled", [True, False], ids=["C", "python"])
@pytest.mark.parametrize("fmt", ["memmap", "parquet"])
def test_windows_are_the_same_mapped_or_read(make_store, fmt, compiled, monkeypatch):
    """The same windows whether the C reader is built or not (an install without a compiler: nothing is
    mapped); built, each shard is mapped once, read-only, and no descriptor is held per mapping."""
    from lmdata.store.formats import raw_windows

    if not compiled:
        _no_read_mapped(monkeypatch)
        monkeypatch.setattr(raw_windows, "read_windows", None)
        monkeypatch.setattr(raw_windows, "read_batch", None)
        monkeypatch.setattr(raw_windows, "preads", None)
    syn = make_store([fmt], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", fmt)
    starts = _starts(syn)
    for verify_pass in range(2):  # the first checks every block it reads, the second reads checked blocks
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    ours = {os.path.realpath(s.path) for s in reader._sources if isinstance(s, raw_windows.RawFile)}
    assert len(ours) == len(reader.shards)
    with open("/proc/self/maps") as fh:
        mapped = [line.split() for line in fh if line.split()[-1] in ours]
    if compiled:
        assert len({m[-1] for m in mapped}) == len(mapped) == len(reader.shards)  # each shard (or its decoded copy) mapped once
        assert all(m[1].startswith("r") and "w" not in m[1] for m in mapped)  # read-only
    else:
        assert not mapped
    assert len(descriptors().fds) <= descriptors().size


def _no_read_mapped(monkeypatch) -> None:
    """An extension built without ``read_mapped``: nothing is mapped (both modules that use it)."""
    from lmdata.store.formats import mapped_windows, raw_windows

    monkeypatch.setattr(raw_windows, "read_mapped", None)
    monkeypatch.setattr(mapped_windows, "read_mapped", None)


def _pread_only(monkeypatch) -> None:
    """``LMDATA_MAP_SHARDS=0`` for this test: every window a ``pread`` through the descriptor pool."""
    from lmdata.io import mappings

    monkeypatch.setattr(mappings, "_switch", [])
    monkeypatch.setenv("LMDATA_MAP_SHARDS", "0")


def test_a_memmap_shard_removed_under_the_reader_is_an_error_naming_it(make_store, monkeypatch):
    _pread_only(monkeypatch)
    syn = make_store(["memmap"])
    reader = open_store(syn.path).reader("train", "memmap")
    starts = _starts(syn, n=8)
    reader.windows(starts, 1025)
    descriptors().close_all()  # its descriptor is gone too (as after the pool evicted it)
    for f in (syn.path / "train" / "memmap").glob("tokens-*.bin"):
        f.unlink()
    with pytest.raises(LmdataError, match=r"tokens-\d+\.bin: shard \d+.*went missing.*lmdata verify"):
        reader.windows(starts, 1025)


def test_a_mapped_shard_removed_under_the_reader_still_reads_its_bytes(make_store):
    """A mapping holds the file's data, as an open descriptor does: removing the file changes nothing."""
    syn = make_store(["memmap"])
    reader = open_store(syn.path).reader("train", "memmap")
    starts = _starts(syn, n=8)
    reader.windows(starts, 1025)
    assert reader._mappings.bases.all() and not descriptors().fds  # mapped at the first batch, nothing held
    for f in (syn.path / "train" / "memmap").glob("tokens-*.bin"):
        f.unlink()
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))


def test_a_decoded_parquet_copy_evicted_under_the_reader_is_decoded_again(make_store, monkeypatch):
    _pread_only(monkeypatch)
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


def test_a_damaged_copy_remade_by_another_process_never_serves_the_damaged_bytes(make_store):
    """A decoded copy damaged in place, opened and mapped by this reader's first touch, then remade by
    another process (a new file renamed over it): every read of it is the store's tokens. A first touch
    that closed copies' descriptors after mapping them let a pread open the new file, check its blocks
    and mark them, after which the damaged mapping served them unchecked."""
    syn = make_store(["parquet"], shard_tokens=2_000)
    store = open_store(syn.path)
    first = store.reader("train", "parquet")
    first.windows(np.array([s.first_token for s in first.shards]), 1)  # every copy made
    descriptors().close_all()
    reader = store.reader("train", "parquet")
    victim = 3
    path = reader.copies.path_of(reader._copy_key(victim), reader.dtype)
    good = Path(path).read_bytes()
    damaged = bytearray(good)
    damaged[len(good) // 2] ^= 0xFF
    Path(path).write_bytes(bytes(damaged))  # in place: the same inode
    reader.windows(np.array([reader.shards[0].first_token]), 8)  # the first touch opens every copy
    tmp = Path(path).with_name(Path(path).name + ".remade")
    tmp.write_bytes(good)
    os.replace(tmp, path)  # another process remakes it
    mid = reader.shards[victim].first_token + (len(good) // 2) // reader.dtype.itemsize - 4
    starts = np.array([mid])
    for _ in range(2):
        np.testing.assert_array_equal(reader.windows(starts, 8), _expected(syn, starts, 8))


def _in_threads(read, n: int) -> None:
    """``read(seed)`` on ``n`` threads at once, seeds 0..n-1; returns when all have ended."""
    threads = [threading.Thread(target=read, args=(s,)) for s in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


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

    _in_threads(read, 4)
    assert not errors, errors


def test_one_reader_shared_by_threads_whose_pools_keep_closing_descriptors(make_store):
    """Each thread reads through its own pool and its own array of descriptors (``_thread_fds``):
    a pool of 4 closes one at nearly every read, never under another thread's read."""
    from lmdata.io import descriptors as d

    syn = make_store(["memmap"], shard_tokens=1_000)
    reader, errors, arrays = open_store(syn.path).reader("train", "memmap"), [], []
    assert len(reader.shards) > 4 * 4

    def read(seed):
        d._local.pool = d.Descriptors(4)
        try:
            for k in range(30):
                starts = _starts(syn, n=32, length=257, seed=seed * 100 + k)
                np.testing.assert_array_equal(reader.windows(starts, 257), _expected(syn, starts, 257))
            arrays.append(reader._thread_fds()[1])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            d._local.pool.close_all()

    _in_threads(read, 4)
    assert not errors, errors
    assert len({id(a) for a in arrays}) == 4  # no thread read another's descriptors


@pytest.mark.parametrize("mapped", [True, False], ids=["mapped", "pread"])
def test_a_first_batch_opens_every_shard_of_the_split_at_once(make_store, mapped, monkeypatch):
    """One C call (``open_shards``) opens the split's shards and loads their CRCs at the first batch; mapped,
    each is mapped then and its descriptor closed again, else the pool holds it."""
    if not mapped:
        _pread_only(monkeypatch)
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    starts = _starts(syn, n=3)
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert reader._n_sources == len(reader.shards) > 10
    assert (reader._mode == 1).all()  # every shard's CRCs in the flat array, each sidecar's checksum checked
    held = descriptors().fds
    assert reader._mappings.bases.all() == mapped
    assert all((str(syn.path / "train" / "memmap" / s.files[0].path) in held) != mapped for s in reader.shards)
    starts = _starts(syn, seed=1)
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))


@pytest.mark.parametrize("compiled", [True, False], ids=["C", "python"])
def test_a_damaged_sidecar_or_shard_is_named_when_a_batch_meets_it(make_store, compiled, monkeypatch):
    """Opened at the first batch, refused when a window needs it: the same errors with or without C."""
    from lmdata.store.formats import memmap

    if not compiled:
        monkeypatch.setattr(memmap, "open_shards", None)
    syn = make_store(["memmap"], shard_tokens=2_000)
    folder = syn.path / "train" / "memmap"
    sidecar = folder / "tokens-00002.bin.crc"
    raw = bytearray(sidecar.read_bytes())
    raw[12] ^= 1  # its reserved header field: only the sidecar's checksum in the manifest tells
    sidecar.write_bytes(bytes(raw))
    descriptors().close_all()
    reader = open_store(syn.path).reader("train", "memmap")
    shard = folder / "tokens-00003.bin"
    shard.write_bytes(shard.read_bytes()[:-2])  # after the open's size checks
    bounds = reader._shard_bounds
    reader.windows(np.array([bounds[0], bounds[5]]), 10)  # shards 2 and 3 are not read yet
    with pytest.raises(LmdataError, match=r"tokens-00002\.bin\.crc: shard 00002 checksum file fails its xxh128"):
        reader.windows(np.array([bounds[2]]), 10)
    with pytest.raises(LmdataError, match=r"tokens-00003\.bin: shard 00003 file has \d+ bytes, the manifest says"):
        reader.windows(np.array([bounds[3] + 5]), 10)


@pytest.mark.parametrize("fmt", ["parquet", "lance"])
def test_a_reader_opens_every_copy_on_the_machine_at_its_first_batch(make_store, fmt):
    """The machine's decoded copies that are there are opened at once, their CRCs loaded, their use
    recorded (eviction goes by it); the windows are the stream's."""
    from lmdata.store.formats.lance_chunks import chunks_of
    from lmdata.store.windows import shard_bounds

    syn = make_store([fmt], shard_tokens=2_000)
    first = open_store(syn.path).reader("train", fmt)
    bounds = shard_bounds(chunks_of(first.shards)[0]) if fmt == "lance" else first._shard_bounds
    first.windows(bounds[:-1][np.diff(bounds) > 0], 1)  # every shard's copy made
    copies = sorted(Path(os.environ["LMDATA_CACHE_DIR"]).rglob("*.bin"))
    assert len(copies) == len(bounds) - 1 > 10
    for c in copies:
        os.utime(c, ns=(0, 0))
    descriptors().close_all()
    reader = open_store(syn.path).reader("train", fmt)
    starts = _starts(syn, n=3)
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    raw = reader._chunks if fmt == "lance" else reader
    assert raw._n_sources == len(raw.shards) == len(copies)
    assert (raw._mode == 1).all()
    assert all(c.stat().st_mtime_ns > 0 for c in copies)
    starts = _starts(syn, seed=2)
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))


@pytest.mark.parametrize("mapped", [True, False], ids=["read_mapped", "read_batch"])
@pytest.mark.parametrize("verify", ["first-use", "size"])
def test_once_its_shards_are_open_a_batch_is_one_c_call(make_store, verify, mapped, monkeypatch):
    """``read_mapped`` and ``read_batch`` find the pieces themselves: the NumPy piece path runs only while
    shards are opened (and mapped)."""
    from lmdata.store.formats import raw_windows

    if not mapped:
        _no_read_mapped(monkeypatch)
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap", verify=verify)
    reader.windows(_starts(syn, n=2), 1025)  # the first batch opens every shard
    reader.windows(np.asarray(reader._shard_bounds[:-1], dtype=np.int64), 1)  # and the next maps them
    if mapped:
        assert (reader._mappings.bases != 0).all()
    calls = []
    real = reader._pieces
    monkeypatch.setattr(reader, "_pieces", lambda *a: calls.append(1) or real(*a))
    for seed in range(3):  # windows across shard bounds (2,000-token shards) and fresh blocks included
        starts = _starts(syn, seed=seed)
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert not calls
    if verify == "first-use":
        assert reader._done.any()


def test_a_shard_cut_short_under_its_mapping_is_an_error_naming_it(make_store):
    """The copy out of a mapping meets a file truncated since (SIGBUS, caught in C): the ``pread`` path
    then names the file, and the process lives on."""
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    starts = np.arange(0, len(syn.stream) - 1025, 500)  # every shard
    for _ in range(2):  # opened, then mapped
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert (reader._mappings.bases != 0).all()
    victim = sorted((syn.path / "train" / "memmap").glob("tokens-*.bin"))[1]
    os.truncate(victim, 16)
    with pytest.raises(LmdataError, match=rf"{victim.name}.*(shorter than the manifest|went missing|lmdata verify)"):
        reader.windows(starts, 1025)
    ok = starts[starts + 1025 <= reader._shard_bounds[1]]  # the first shard is whole: still read
    np.testing.assert_array_equal(reader.windows(ok, 1025), _expected(syn, ok, 1025))


def test_past_the_mapping_limit_shards_are_read_by_pread(make_store, monkeypatch):
    from lmdata.io import mappings

    monkeypatch.setattr(mappings, "MAX_MAPPINGS", mappings._live[0] + 3)
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    for seed in range(4):
        starts = _starts(syn, seed=seed)
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert 0 < np.count_nonzero(reader._mappings.bases) <= 3


def test_a_reader_collected_unmaps_its_shards(make_store):
    import gc

    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    starts = np.arange(0, len(syn.stream) - 1025, 500)
    for _ in range(2):
        reader.windows(starts, 1025)
    files = {os.path.realpath(s.path) for s in reader._sources}

    def mapped() -> int:
        with open("/proc/self/maps") as fh:
            return sum(line.split()[-1] in files for line in fh)

    assert mapped() == len(files)
    del reader
    gc.collect()
    assert mapped() == 0


def test_lmdata_map_shards_0_reads_with_pread_and_maps_nothing(make_store, monkeypatch):
    from lmdata.io import mappings

    monkeypatch.setattr(mappings, "_switch", [])
    monkeypatch.setenv("LMDATA_MAP_SHARDS", "0")
    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    for seed in range(3):
        starts = _starts(syn, seed=seed)
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert not reader._mappings.bases.any()
    monkeypatch.setattr(mappings, "_switch", [])
    monkeypatch.setenv("LMDATA_MAP_SHARDS", "yes")
    with pytest.raises(LmdataError, match=r"LMDATA_MAP_SHARDS='yes': give 1 .* or 0"):
        reader.windows(starts, 1025)


def test_a_cut_short_shard_is_still_named_after_another_sigbus_handler_was_installed(make_store):
    """A torch DataLoader worker installs its own SIGBUS handler (for its shared memory): the mapped
    read puts its own back for its copies, so a file cut short is still named, not a crash."""
    import signal

    syn = make_store(["memmap"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "memmap")
    starts = np.arange(0, len(syn.stream) - 1025, 500)
    for _ in range(2):
        reader.windows(starts, 1025)
    before = signal.signal(signal.SIGBUS, lambda *a: None)  # replaces ours at the C level
    try:
        os.truncate(sorted((syn.path / "train" / "memmap").glob("tokens-*.bin"))[2], 8)
        with pytest.raises(LmdataError, match=r"tokens-00002\.bin"):
            reader.windows(starts, 1025)
    finally:
        signal.signal(signal.SIGBUS, before if before is not None else signal.SIG_DFL)


def test_shards_held_in_memory_skip_the_mapped_path(make_store, monkeypatch):
    """With the machine's cache off, Parquet shards are decoded into memory: nothing to map, so no
    batch after the first tries (each try cost a piece search and a lock: 129 -> 175 M tok/s)."""
    monkeypatch.setenv("LMDATA_PARQUET_CACHE_BYTES", "0")
    syn = make_store(["parquet"], shard_tokens=2_000)
    reader = open_store(syn.path).reader("train", "parquet")
    reader.windows(_starts(syn, n=4), 1025)
    tries = []
    real = reader._map_batch
    monkeypatch.setattr(reader, "_map_batch", lambda *a: tries.append(1) or real(*a))
    for seed in range(3):
        starts = _starts(syn, seed=seed)
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert not tries
    assert not reader._mappings.bases.any()
