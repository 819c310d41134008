"""A large split's shards opened on a thread behind the first batch: the same windows, each shard opened once."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from lmdata.data.loader import make_loader
from lmdata.errors import LmdataError
from lmdata.store import open_store
from lmdata.store.formats import open_behind
from lmdata.store.formats.lance_chunks import LanceChunks


def _expected(syn, starts, length):
    return syn.stream[starts[:, None] + np.arange(length)]


def _starts(syn, n, seed, length=1025):
    return np.random.default_rng(seed).integers(0, len(syn.stream) - length, size=n)


def _hold_the_thread(monkeypatch) -> threading.Event:
    """The ``open_behind`` thread waits, once started, until the returned event is set."""
    gate = threading.Event()
    original = open_behind._open_rest

    def held(*args):
        gate.wait(30)
        original(*args)

    monkeypatch.setattr(open_behind, "_open_rest", held)
    return gate


def _join(reader) -> None:
    thread = reader._behind.thread
    thread.join(timeout=60)
    assert not thread.is_alive()


def test_the_first_batch_opens_its_own_shards_and_a_thread_the_rest(make_store, behind):
    syn = make_store(["memmap"], shard_tokens=1_000)
    reader = open_store(syn.path).reader("train", "memmap")
    assert len(reader.shards) > 10
    for seed in range(30):  # read while the thread opens
        starts = _starts(syn, 32, seed)
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    _join(reader)
    assert reader._n_sources == len(reader.shards)
    assert (reader._mode == 1).all()  # every shard's CRCs loaded and its sidecar's checksum checked
    assert reader._mappings.bases.all()  # every shard mapped...
    assert set(behind) == set(range(len(reader.shards))) and set(behind.values()) == {1}  # ...and opened once


def test_readers_of_a_split_of_fewer_shards_open_it_all_at_the_first_batch(make_store, behind, monkeypatch):
    monkeypatch.setattr(open_behind, "OPEN_BEHIND_FROM", 10_000)
    syn = make_store(["memmap"], shard_tokens=1_000)
    reader = open_store(syn.path).reader("train", "memmap")
    starts = _starts(syn, 2, 0)
    np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert reader._behind is None and reader._n_sources == len(reader.shards)


def _raw(reader):
    """The ``RawWindows`` that reads ``reader``'s windows (Lance: its ``LanceChunks``, made at the first read)."""
    if reader.__class__.__name__ != "LanceReader":
        return reader
    if reader._chunks is False:
        reader._chunks = LanceChunks.of(reader)
    return reader._chunks


def _warm_copies(syn, fmt, monkeypatch):
    """Every shard's decoded copy made on this machine (a first run), read by a reader that opens at once."""
    from lmdata.io.descriptors import descriptors

    with monkeypatch.context() as m:
        m.setattr(open_behind, "OPEN_BEHIND_FROM", 10_000)
        reader = open_store(syn.path).reader("train", fmt)
        starts = np.array([s.first_token for s in _raw(reader).shards])
        np.testing.assert_array_equal(reader.windows(starts, 1), _expected(syn, starts, 1))
        assert _raw(reader)._behind is None
    descriptors().close_all()  # as a later process: no copy held (a held one is not opened again)


def _copy_fds(root) -> int:
    """This process's descriptors open on a file under ``root`` (the machine's copies)."""
    import os

    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(str(root))
        except OSError:
            pass
    return n


@pytest.mark.parametrize("fmt", ["parquet", "lance"])
def test_a_machines_decoded_copies_open_behind_too_and_keep_no_descriptor(make_store, behind, fmt, monkeypatch,
                                                                          tmp_path):
    """A copy the thread opens is mapped and its descriptor closed: the thread's pool is no reading
    thread's. The first batch's own copies are in its thread's pool, as before."""
    import os

    from lmdata.io.descriptors import descriptors

    syn = make_store([fmt], shard_tokens=1_000)
    _warm_copies(syn, fmt, monkeypatch)
    behind.clear()
    reader = open_store(syn.path).reader("train", fmt)
    raw = _raw(reader)
    assert len(raw.shards) > 10
    first = np.array([raw.shards[0].first_token])
    np.testing.assert_array_equal(reader.windows(first, 10), _expected(syn, first, 10))
    assert raw._behind is not None
    _join(raw)
    assert raw._n_sources == len(raw.shards) and (raw._mode == 1).all() and raw._mappings.bases[1:].all()
    assert set(behind) == set(range(len(raw.shards))) and set(behind.values()) == {1}
    root = os.path.realpath(raw.copies.root)
    held = sum(p.startswith(root) for p in descriptors().fds)
    assert held == 1 and _copy_fds(root) == 1  # the first batch's copy, in its pool; the thread's closed
    for seed in range(30):
        starts = _starts(syn, 8, seed)
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    assert raw._mappings.bases.all()  # the first batch's, mapped by the next through its descriptor


@pytest.mark.parametrize("fmt", ["parquet", "lance"])
def test_batches_and_the_thread_open_each_copy_once(make_store, behind, fmt, monkeypatch):
    syn = make_store([fmt], shard_tokens=1_000)
    _warm_copies(syn, fmt, monkeypatch)
    behind.clear()
    reader = open_store(syn.path).reader("train", fmt)
    for seed in range(30):  # read while the thread opens
        starts = _starts(syn, 8, seed)
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
    _join(_raw(reader))
    assert set(behind) == set(range(len(_raw(reader).shards))) and set(behind.values()) == {1}


@pytest.mark.parametrize("fmt", ["parquet", "lance"])
def test_a_copy_opened_behind_reads_on_when_evicted_and_is_made_again_when_damaged(make_store, behind, fmt,
                                                                                   monkeypatch):
    """Another process evicting a mapped copy leaves the mapping's file to the batches; a copy damaged in
    place fails its CRC, is dropped with its mapping, and is made again."""
    import os

    syn = make_store([fmt], shard_tokens=1_000)
    _warm_copies(syn, fmt, monkeypatch)
    reader = open_store(syn.path).reader("train", fmt)
    raw = _raw(reader)
    one = np.array([raw.shards[0].first_token])
    reader.windows(one, 10)
    _join(raw)
    evicted, damaged = raw.shards[-1], raw.shards[-2]
    gone = raw._sources[len(raw.shards) - 1].path
    raw.copies.drop(type(raw.copies.root)(gone))  # another process's eviction
    assert not os.path.exists(gone)
    at = np.array([evicted.first_token + 5])
    np.testing.assert_array_equal(reader.windows(at, 200), _expected(syn, at, 200))
    path, old_map = raw._sources[len(raw.shards) - 2].path, raw._mappings.bases[len(raw.shards) - 2]
    with open(path, "r+b") as f:  # a bit flipped in place: the mapping sees it too
        f.seek(6)
        byte = f.read(1)
        f.seek(6)
        f.write(bytes([byte[0] ^ 0x40]))
    at = np.array([damaged.first_token])
    np.testing.assert_array_equal(reader.windows(at, 300), _expected(syn, at, 300))  # dropped, made again
    np.testing.assert_array_equal(reader.windows(at, 300), _expected(syn, at, 300))
    assert old_map and raw._mappings.bases[len(raw.shards) - 2] != old_map  # the damaged copy's mapping retired
    assert os.path.exists(raw._sources[len(raw.shards) - 2].path)



def _damage_and_remake(path: str) -> None:
    """A copy damaged in place (a bit flipped: the file a mapping holds), then dropped and made again by
    another process (tmp + rename: a new file, sound, at the same path)."""
    import os

    with open(path, "rb") as f:
        good = f.read()
    with open(path, "r+b") as f:
        f.seek(6)
        byte = f.read(1)
        f.seek(6)
        f.write(bytes([byte[0] ^ 0x40]))
    with open(path + ".remade", "wb") as f:
        f.write(good)
    os.replace(path + ".remade", path)


@pytest.mark.parametrize("fmt", ["parquet", "lance"])
def test_a_damaged_copy_remade_by_another_process_is_not_read_on_from_its_mapping(make_store, behind, fmt,
                                                                                  monkeypatch):
    """The thread's mapping holds the damaged file, the pread that follows its failed check opens the remade
    one by path: a check passed there must not vouch for the mapping (its blocks had been marked checked,
    and the next batch copied the damaged bytes out of the mapping unchecked)."""
    syn = make_store([fmt], shard_tokens=1_000)
    _warm_copies(syn, fmt, monkeypatch)
    reader = open_store(syn.path).reader("train", fmt)
    raw = _raw(reader)
    reader.windows(np.array([raw.shards[0].first_token]), 10)
    _join(raw)
    k = len(raw.shards) - 2
    old = raw._mappings.bases[k]
    assert old  # mapped by the thread, no descriptor kept
    _damage_and_remake(raw._sources[k].path)
    at = np.array([raw.shards[k].first_token])
    for _ in range(3):
        np.testing.assert_array_equal(reader.windows(at, 300), _expected(syn, at, 300))
    assert raw._mappings.bases[k] not in (0, old)  # mapped again, through the remade file

def test_a_damaged_shard_is_named_by_the_batch_that_meets_it_and_the_others_read(make_store, behind):
    syn = make_store(["memmap"], shard_tokens=1_000)
    store = open_store(syn.path)
    reader = store.reader("train", "memmap")
    victim = reader.shards[len(reader.shards) // 2]
    path = syn.path / "train" / "memmap" / victim.files[0].path
    path.write_bytes(path.read_bytes()[:-2])
    fresh = store.reader("train", "memmap")
    one = np.array([reader.shards[0].first_token])
    np.testing.assert_array_equal(fresh.windows(one, 100), _expected(syn, one, 100))
    _join(fresh)
    with pytest.raises(LmdataError, match=path.name):
        fresh.windows(np.array([victim.first_token]), 10)
    last = np.array([reader.shards[-1].first_token])
    np.testing.assert_array_equal(fresh.windows(last, 100), _expected(syn, last, 100))


@pytest.mark.parametrize("fmt, workers", [("memmap", 0), ("memmap", 2), ("parquet", 0), ("lance", 2)])
def test_the_loader_hands_out_the_same_batches(make_store, behind, fmt, workers, monkeypatch):
    """Through the loader (at 0 workers its look-ahead hands the thread the next batches' shards,
    ``check_ahead``), the batches of a split opened behind are those of one opened at once."""
    syn = make_store([fmt], shard_tokens=1_000)
    if fmt != "memmap":
        _warm_copies(syn, fmt, monkeypatch)
        behind.clear()

    def batches():
        ds = open_store(syn.path).dataset("train", 64, fmt)
        return [np.concatenate([t.numpy() for t in b], axis=1) for b in make_loader(ds, 8, num_workers=workers, seed=3)]

    opened_behind = batches()
    if workers == 0:
        assert set(behind.values()) == {1}  # (the workers' first touches are in their own processes)
    monkeypatch.setattr(open_behind, "OPEN_BEHIND_FROM", 10_000)
    at_once = batches()
    assert len(opened_behind) == len(at_once) > 20
    for a, b in zip(opened_behind, at_once):
        np.testing.assert_array_equal(a, b)


def test_the_wanted_shards_are_opened_first(make_store, behind, monkeypatch):
    syn = make_store(["memmap"], shard_tokens=1_000)
    reader = open_store(syn.path).reader("train", "memmap")
    gate = _hold_the_thread(monkeypatch)  # the thread waits until the shards are wanted
    first = np.array([reader.shards[0].first_token])
    reader.windows(first, 10)
    last = len(reader.shards) - 1
    reader.check_ahead(np.array([reader.shards[last].first_token]), 10)
    gate.set()
    _join(reader)
    order = list(behind)
    assert order.index(last) == 1  # after the first batch's own shard, before the shards in order


def test_a_reader_let_go_stops_its_thread(make_store, behind, monkeypatch):
    syn = make_store(["memmap"], shard_tokens=1_000)
    gate = _hold_the_thread(monkeypatch)
    reader = open_store(syn.path).reader("train", "memmap")
    reader.windows(np.array([reader.shards[0].first_token]), 10)
    thread = reader._behind.thread
    assert open_behind.opening()  # what ``lmdata bench``'s automatic warm-up waits for
    del reader
    gc.collect()
    gate.set()
    thread.join(timeout=30)
    assert not thread.is_alive() and len(behind) == 1  # nothing opened after the first batch's shard
    assert not open_behind.opening()


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # (imported by other tests; not used here)
def test_a_fork_while_the_thread_opens_inherits_none_of_its_descriptors(make_store, behind, monkeypatch):
    """A chunk's descriptors are open between ``open_shards`` and the mapping; a fork waits for the chunk
    (``background.fetching``), else the child keeps them for good (a DataLoader worker had kept 32)."""
    import os
    import time

    from lmdata.store.formats import mapped_windows

    opened = mapped_windows.open_shards

    def slow(*args):  # the descriptors held open a while, as on a slow disk
        opened(*args)
        time.sleep(0.02)

    monkeypatch.setattr(mapped_windows, "open_shards", slow)
    syn = make_store(["memmap"], shard_tokens=1_000)
    reader = open_store(syn.path).reader("train", "memmap")
    reader.windows(np.array([reader.shards[0].first_token]), 10)
    shard_dir = os.path.realpath(syn.path / "train" / "memmap")  # (the store's read lock is held open, rightly)
    inherited = []
    while reader._behind.thread.is_alive():
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: how many of the split's shard files it holds open
            n = 0
            for fd in os.listdir("/proc/self/fd"):
                try:
                    n += os.readlink(f"/proc/self/fd/{fd}").startswith(shard_dir)
                except OSError:
                    pass
            os.write(w, str(n).encode())
            os._exit(0)
        os.close(w)
        inherited.append(int(os.read(r, 16) or b"0"))
        os.close(r)
        os.waitpid(pid, 0)
    assert len(inherited) > 3 and not any(inherited), inherited


def test_a_workers_thread_is_seen_from_the_process_above_it():
    """``lmdata bench`` looks for the thread in the processes below it while a loader's workers open their
    split: the thread names itself for the kernel (``OS_NAME``), which the parent reads in ``/proc``."""
    import os
    import subprocess
    import sys
    import time

    from lmdata.bench import stall

    def below() -> bool:
        return any(stall.has_thread_named(k, open_behind.OS_NAME) for k in stall.descendants(os.getpid()))

    child = subprocess.Popen([sys.executable, "-c", (
        "import threading, time, sys\n"
        "from lmdata.store.formats import open_behind\n"
        "t = threading.Thread(target=lambda: (open_behind._name_for_the_kernel(), time.sleep(30)), daemon=True)\n"
        "t.start(); print('ready', flush=True); sys.stdin.read()\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        deadline = time.monotonic() + 10
        while not below() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert below() and not open_behind.opening()
    finally:
        child.communicate(b"")
    assert not below()


def test_a_remote_stores_copies_open_behind_and_the_missing_ones_are_fetched_by_their_batches(make_store, behind,
                                                                                             s3, monkeypatch):
    """On object storage the thread opens the copies the machine has (here: half, made by an earlier
    reader) and leaves the others to the batches that meet them (fetched, or by the mirror threads)."""
    from lmdata.ingest.publish import publish
    from lmdata.io.descriptors import descriptors
    from lmdata.io.location import location

    syn = make_store(["memmap"], shard_tokens=1_000)
    uri = s3.uri("behind")
    publish(syn.path, location(uri))
    with monkeypatch.context() as m:
        m.setattr(open_behind, "OPEN_BEHIND_FROM", 10_000)
        m.setattr("lmdata.store.formats.shard_copies.MIRROR_FETCHES", 0)  # only what batches meet
        early = open_store(uri).reader("train", "memmap")
        half = np.array([s.first_token for s in early.shards[::2]])
        np.testing.assert_array_equal(early.windows(half, 1), _expected(syn, half, 1))
    descriptors().close_all()
    behind.clear()
    reader = open_store(uri).reader("train", "memmap")
    assert len(reader.shards) > 10 and reader.remote
    one = np.array([reader.shards[0].first_token])
    np.testing.assert_array_equal(reader.windows(one, 10), _expected(syn, one, 10))
    _join(reader)
    assert reader._n_sources >= len(reader.shards) // 2
    for seed in range(20):
        starts = _starts(syn, 8, seed)
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))


@pytest.mark.parametrize("fmt", ["memmap", "parquet"])
def test_batches_that_overtake_the_thread_open_the_rest_at_once(make_store, behind, fmt, monkeypatch):
    """Reading faster than the thread opens (here: the thread held), the batches open more shards
    themselves than it has; past ``OVERTAKEN_FROM`` a batch opens the rest at once, and the thread ends."""
    monkeypatch.setattr(open_behind, "OVERTAKEN_FROM", 3)
    syn = make_store([fmt], shard_tokens=1_000)
    if fmt != "memmap":
        _warm_copies(syn, fmt, monkeypatch)
        behind.clear()
    gate = _hold_the_thread(monkeypatch)
    reader = open_store(syn.path).reader("train", fmt)
    n = len(reader.shards)
    for seed in range(3):  # each opens the shards it meets; by the third the batches have overtaken
        starts = _starts(syn, 4, seed)
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
        if reader._n_sources == n:
            break
    assert reader._n_sources == n
    gate.set()
    _join(reader)  # (every shard open: it ends at once)
    assert set(behind) == set(range(n)) and set(behind.values()) == {1}  # the thread opened nothing after
    for seed in range(3, 10):
        starts = _starts(syn, 8, seed)
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
