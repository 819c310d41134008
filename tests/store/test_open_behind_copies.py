"""A machine's decoded copies opened behind the first batch (``open_behind``): other processes evicting or
remaking them, the thread's keys computed outside the touch lock, the pread paths, remote stores, forks,
the loader and the interpreter's exit. Small stores, every split opened behind (``behind``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from test_open_behind import _copy_fds, _damage_and_remake, _expected, _join, _raw, _starts, _warm_copies

from lmdata.data.loader import make_loader
from lmdata.errors import LmdataError
from lmdata.io import mappings
from lmdata.store import open_store
from lmdata.store.formats import open_behind, shard_copies
from lmdata.store.formats.parquet_cache import DecodedShards


def _opened_behind(syn, fmt, monkeypatch, behind, **kw):
    """A reader of ``syn``'s warm copies whose first batch (shard 0) started the thread."""
    _warm_copies(syn, fmt, monkeypatch)
    behind.clear()
    reader = open_store(syn.path).reader("train", fmt, **kw)
    one = np.array([_raw(reader).shards[0].first_token])
    np.testing.assert_array_equal(reader.windows(one, 10), _expected(syn, one, 10))
    return reader, _raw(reader)


def _reads_right(reader, syn, seeds, n=8):
    for seed in seeds:
        starts = _starts(syn, n, seed)
        np.testing.assert_array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))


def _flip(path: str, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))


@pytest.mark.parametrize("fmt", ["parquet", "lance"])
def test_copies_evicted_or_remade_under_the_threads_mappings_read_on(make_store, behind, fmt, monkeypatch):
    """Every copy the thread mapped evicted by another process before its first read, half of them made
    again (a new file at the path): the mappings serve the batches, and a pread meets the new files."""
    syn = make_store([fmt], shard_tokens=1_000)
    reader, raw = _opened_behind(syn, fmt, monkeypatch, behind)
    _join(raw)
    for k in range(1, len(raw.shards)):
        path = raw._sources[k].path
        with open(path, "rb") as f:
            good = f.read()
        raw.copies.drop(type(raw.copies.root)(path))
        if k % 2:
            with open(path + ".remade", "wb") as f:
                f.write(good)
            os.replace(path + ".remade", path)
    _reads_right(reader, syn, range(20))
    assert set(behind.values()) == {1}


@pytest.mark.parametrize("how", ["damaged", "forgotten"])
@pytest.mark.parametrize("fmt", ["parquet", "lance"])
def test_a_batch_reopening_a_copy_while_the_thread_holds_its_key_opens_it_once(make_store, behind, fmt, how,
                                                                                  monkeypatch):
    """The thread has shard k's key and path (``_copy_paths``, outside the touch lock) when a batch opens
    k itself and then drops it: a block failing its CRC (dropped and made again), or its copy gone and
    its checks forgotten (``_open_again``'s first step). The thread then opens no stale copy of k."""
    syn = make_store([fmt], shard_tokens=1_000)
    _warm_copies(syn, fmt, monkeypatch)
    behind.clear()
    reader = open_store(syn.path).reader("train", fmt)
    raw = _raw(reader)
    k, found, go = len(raw.shards) // 2, threading.Event(), threading.Event()
    copy_paths = shard_copies.CopiedShards._copy_paths

    def held(self, shards):
        shards = list(shards)
        got = copy_paths(self, shards)
        if open_behind.on_thread() and k in shards:
            found.set()
            go.wait(30)
        return got

    monkeypatch.setattr(shard_copies.CopiedShards, "_copy_paths", held)
    reader.windows(np.array([raw.shards[0].first_token]), 10)
    assert found.wait(30)
    at = np.array([raw.shards[k].first_token])
    np.testing.assert_array_equal(reader.windows(at, 10), _expected(syn, at, 10))  # k opened by the batch
    if how == "damaged":
        _flip(raw._sources[k].path, 4096 + 6)  # a block not read yet
        later = at + 2048
        np.testing.assert_array_equal(reader.windows(later, 200), _expected(syn, later, 200))
    else:
        raw.copies.drop(type(raw.copies.root)(raw._sources[k].path))
        raw._forget_checks(k)
    go.set()
    _join(raw)
    _reads_right(reader, syn, range(10))
    np.testing.assert_array_equal(reader.windows(at, 900), _expected(syn, at, 900))
    assert behind[k] == 2 and all(n == 1 for i, n in behind.items() if i != k)


def test_a_copy_cut_short_under_the_threads_mapping_is_made_again(make_store, behind, monkeypatch):
    """A copy is the machine's, not the store: cut short (SIGBUS in the mapping, caught; a short ``pread``),
    it is made again as a lost one is, and the windows read right. The store's own file cut short is an
    error naming it (``test_a_damaged_shard_is_named_by_the_batch_that_meets_it_and_the_others_read``)."""
    syn = make_store(["parquet"], shard_tokens=1_000)
    reader, raw = _opened_behind(syn, "parquet", monkeypatch, behind)
    _join(raw)
    k = len(raw.shards) - 2
    path = raw._sources[k].path
    size = os.path.getsize(path)
    os.truncate(path, 1000)
    at = np.array([raw.shards[k].first_token + 100])
    np.testing.assert_array_equal(reader.windows(at, 800), _expected(syn, at, 800))
    assert os.path.getsize(raw._sources[k].path) == size  # made again, whole
    others = np.array([s.first_token for s in raw.shards[:k]])
    np.testing.assert_array_equal(reader.windows(others, 500), _expected(syn, others, 500))


def test_a_rewritten_source_is_decoded_again_and_a_damaged_one_named(make_store, behind, monkeypatch):
    """A Parquet shard rewritten after its copy was made: the thread's key (its stat) finds no copy and
    leaves it to the batch, which decodes it again and names the file it fails."""
    syn = make_store(["parquet"], shard_tokens=1_000)
    _warm_copies(syn, "parquet", monkeypatch)
    store = open_store(syn.path)
    victim = store.reader("train", "parquet").shards[-2]
    path = syn.path / "train" / "parquet" / victim.files[0].path
    _flip(str(path), path.stat().st_size // 2)
    reader = store.reader("train", "parquet")
    reader.windows(np.array([reader.shards[0].first_token]), 10)
    _join(reader)
    assert reader._sources[len(reader.shards) - 2] is None
    with pytest.raises(LmdataError, match=path.name):
        reader.windows(np.array([victim.first_token]), 10)
    last = np.array([reader.shards[-1].first_token])
    np.testing.assert_array_equal(reader.windows(last, 100), _expected(syn, last, 100))


@pytest.mark.parametrize("fmt, setting", [("parquet", "no mappings"), ("lance", "no mappings"),
                                          ("parquet", "mapping limit"), ("lance", "verify=size")])
def test_the_pread_paths_read_the_same_windows(make_store, behind, fmt, setting, monkeypatch):
    """``LMDATA_MAP_SHARDS=0`` (no thread), the mapping limit met by the thread (it stops; the rest is
    opened by batches and read by pread), ``verify="size"`` (no CRCs: the thread maps what it opens)."""
    if setting == "no mappings":
        monkeypatch.setattr(mappings, "_switch", [False])
    if setting == "mapping limit":
        monkeypatch.setattr(mappings, "MAX_MAPPINGS", mappings._live[0] + 4)
    syn = make_store([fmt], shard_tokens=1_000)
    reader, raw = _opened_behind(syn, fmt, monkeypatch, behind, **({"verify": "size"} if "size" in setting else {}))
    assert (raw._behind is None) == (setting == "no mappings")
    _reads_right(reader, syn, range(20))
    if raw._behind is not None:
        _join(raw)
    _reads_right(reader, syn, range(20, 25))
    assert set(behind.values()) == {1} and raw._n_sources == len(raw.shards)
    assert (raw._mappings.bases != 0).sum() == {"no mappings": 0, "mapping limit": 4}.get(setting, len(raw.shards))


def test_a_remote_stores_copies_evicted_by_another_process_while_mirrored_and_opened_behind(make_store, behind,
                                                                                            s3, monkeypatch):
    """A third of the copies on the machine, the mirror threads fetching the rest while the thread opens
    what is there, and another process (a smaller budget) evicting copies all the while."""
    from lmdata.ingest.publish import publish
    from lmdata.io.descriptors import descriptors
    from lmdata.io.location import location

    syn = make_store(["memmap"], shard_tokens=1_000)
    uri = s3.uri("behind-evicted")
    publish(syn.path, location(uri))
    with monkeypatch.context() as m:
        m.setattr(open_behind, "OPEN_BEHIND_FROM", 10_000)
        m.setattr(shard_copies, "MIRROR_FETCHES", 0)
        early = open_store(uri).reader("train", "memmap")
        third = np.array([s.first_token for s in early.shards[::3]])
        np.testing.assert_array_equal(early.windows(third, 1), _expected(syn, third, 1))
        other = DecodedShards(early.copies.root, 6_000, "memmap")  # ~3 copies
    del early
    descriptors().close_all()
    behind.clear()
    reader = open_store(uri).reader("train", "memmap")
    stop = threading.Event()

    def evicting() -> None:
        while not stop.is_set():
            other.evict()
            time.sleep(0.001)

    evictor = threading.Thread(target=evicting)
    evictor.start()
    try:
        _reads_right(reader, syn, range(30))
    finally:
        stop.set()
        evictor.join()
    _join(reader)
    _reads_right(reader, syn, range(30, 40))


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # (imported by other tests; not used here)
def test_a_fork_while_the_thread_opens_copies_inherits_none_and_the_child_reads(make_store, behind, monkeypatch):
    from lmdata.store.formats import mapped_windows

    opened = mapped_windows.open_shards

    def slow(*args):  # each chunk's descriptors held open a while
        opened(*args)
        time.sleep(0.02)

    syn = make_store(["parquet"], shard_tokens=1_000)
    _warm_copies(syn, "parquet", monkeypatch)
    monkeypatch.setattr(mapped_windows, "open_shards", slow)
    reader = open_store(syn.path).reader("train", "parquet")
    reader.windows(np.array([reader.shards[0].first_token]), 10)
    root = os.path.realpath(reader.copies.root)
    children = []
    while reader._behind.thread.is_alive():
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                held = _copy_fds(root)  # before the child's pool closes what it inherited
                starts = _starts(syn, 8, 1)
                right = np.array_equal(reader.windows(starts, 1025), _expected(syn, starts, 1025))
                os.write(w, f"{held} {int(right)}".encode())
            finally:
                os._exit(0)
        os.close(w)
        children.append(os.read(r, 32).decode())
        os.close(r)
        os.waitpid(pid, 0)
    assert len(children) > 3 and set(children) == {"1 1"}, children  # (1: the first batch's, in its pool)


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
@pytest.mark.parametrize("opened", ["behind", "at once"])
def test_a_forked_child_and_a_damaged_copy_remade_since_its_parent_mapped_it(make_store, behind, monkeypatch, opened):
    """A forked worker inherits its parent's mappings but not its descriptors: its first touch opens the
    remade copy by path, which must let the inherited mapping of the damaged one go (``_same_file``)."""
    syn = make_store(["parquet"], shard_tokens=1_000)
    if opened == "at once":  # mapped through the pool's descriptors (``_map_opened``), as a split of fewer shards
        monkeypatch.setattr(open_behind, "OPEN_BEHIND_FROM", 10_000)
    reader, raw = _opened_behind(syn, "parquet", monkeypatch, behind)
    if opened == "behind":
        _join(raw)
    else:
        _reads_right(reader, syn, range(2))  # the second batch maps what the first opened
        assert raw._mappings.bases.all()
    k = len(raw.shards) - 2
    _damage_and_remake(raw._sources[k].path)
    at = np.array([raw.shards[k].first_token])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(w, bytes(int(np.array_equal(reader.windows(at, 300), _expected(syn, at, 300))) for _ in range(3)))
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 8)
    os.waitpid(pid, 0)
    assert got == b"\1\1\1", got


@pytest.mark.parametrize("fmt, workers", [("parquet", 2), ("lance", 0)])
def test_the_loader_hands_out_the_same_batches_after_the_parent_read(make_store, behind, fmt, workers, monkeypatch):
    """The parent read a batch first: its thread opens copies while the loader forks its workers."""
    syn = make_store([fmt], shard_tokens=1_000)
    _warm_copies(syn, fmt, monkeypatch)

    def batches():
        ds = open_store(syn.path).dataset("train", 64, fmt)
        ds.reader.windows(np.array([0]), 10)
        return [np.concatenate([t.numpy() for t in b], axis=1) for b in make_loader(ds, 8, num_workers=workers, seed=3)]

    opened_behind = batches()
    monkeypatch.setattr(open_behind, "OPEN_BEHIND_FROM", 10_000)
    at_once = batches()
    assert len(opened_behind) == len(at_once) > 20
    for a, b in zip(opened_behind, at_once):
        np.testing.assert_array_equal(a, b)


EXITING = """
import resource, sys
import numpy as np
from lmdata.store import open_store
from lmdata.store.formats import open_behind
open_behind.OPEN_BEHIND_FROM, open_behind.CHUNK = 4, 1
store, fmt, nofile, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if nofile:
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
else:  # each chunk slow: the thread is still opening at exit
    import time
    from lmdata.store.formats import mapped_windows
    opened = mapped_windows.open_shards
    mapped_windows.open_shards = lambda *args: (opened(*args), time.sleep(0.05))
stream = np.load(sys.argv[5])
reader = open_store(store).reader("train", fmt)
rng = np.random.default_rng(0)
for _ in range(n):
    s = rng.integers(0, len(stream) - 1025, size=8)
    assert np.array_equal(reader.windows(s, 1025), stream[s[:, None] + np.arange(1025)])
print((reader._chunks if fmt == "lance" else reader)._behind.thread.is_alive())
"""


@pytest.mark.parametrize("fmt", ["parquet", "lance"])
def test_exit_while_the_thread_opens_and_a_low_descriptor_limit(make_store, behind, fmt, monkeypatch, tmp_path):
    syn = make_store([fmt], shard_tokens=1_000)
    _warm_copies(syn, fmt, monkeypatch)
    np.save(tmp_path / "stream.npy", syn.stream)
    script = tmp_path / "exiting.py"
    script.write_text(EXITING)
    for nofile, n in ((0, 1), (24, 40)):  # exit at the first batch; then 40 batches under `ulimit -n 24`
        done = subprocess.run([sys.executable, str(script), str(syn.path), fmt, str(nofile), str(n),
                               str(tmp_path / "stream.npy")], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stderr == "", (nofile, done.stderr)
        assert nofile or done.stdout == "True\n"  # (exit: the thread was still opening)
