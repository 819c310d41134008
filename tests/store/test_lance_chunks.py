"""Local Lance windows from the machine's decoded copies of its ingest shards (``lance_chunks``).

Fragments here hold ~2 ingest shards each (conftest), so windows cross chunk and fragment bounds.
A flipped bit in the Lance file is refused through the copies' fetch (test_integrity's Lance cases).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from lmdata.errors import LmdataError

from lmdata.store import open_store
from lmdata.store.formats.lance_chunks import CACHE_SUBDIR, chunks_of
from lmdata.store.protocol import ShardInfo

from lance_bytes import flip_stored_token


def _count_takes(reader) -> list[int]:
    """Count the Lance takes ``reader`` makes from now on (dataset and fragment takes alike)."""
    ds = reader._open()
    takes: list[int] = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def take(self, *args, **kwargs):
            takes.append(1)
            return self.inner.take(*args, **kwargs)

    reader._ds = Counting(ds)
    reader._fragments = [Counting(f) for f in reader._fragments]
    return takes


def _all_starts(n_tokens: int, length: int, fragments) -> np.ndarray:
    edges = np.array([f.first_token for f in fragments[1:]], dtype=np.int64)
    rng = np.random.default_rng(1)
    starts = np.concatenate([rng.integers(0, n_tokens - length, 300), edges - 1, edges - length // 2, edges,
                             [0, n_tokens - length]])
    return starts[(starts >= 0) & (starts <= n_tokens - length)]


def test_chunks_join_consecutive_shards_of_a_fragment_up_to_min_tokens():
    """Remote chunks: a fragment's ingest shards joined in order until a run holds ``min_tokens``
    (the last run of a fragment may hold fewer); chunks tile each fragment, never crossing one."""
    def frag(name, first_doc, first_token, sizes):
        members = [{"name": f"{k:05d}", "n_docs": 2, "n_tokens": n} for k, n in sizes]
        return ShardInfo(name=name, n_docs=2 * len(sizes), n_tokens=sum(n for _, n in sizes), first_doc=first_doc,
                         first_token=first_token, files=[], extra={"members": members})

    fragments = [frag("a", 0, 0, [(0, 30), (1, 30), (2, 50), (3, 10)]), frag("b", 8, 120, [(4, 70), (5, 5)])]
    chunks, home = chunks_of(fragments, min_tokens=60)
    assert [(c.name, c.n_tokens, c.n_docs, c.first_token, c.first_doc) for c in chunks] == [
        ("00000-00001", 60, 4, 0, 0), ("00002-00003", 60, 4, 60, 4), ("00004", 70, 2, 120, 8), ("00005", 5, 2, 190, 10)]
    assert home == [(0, 0), (0, 60), (1, 0), (1, 70)]
    assert [c.name for c in chunks_of(fragments)[0]] == [f"{k:05d}" for k in range(6)]  # 0: one shard each


def test_windows_from_copies_equal_the_stream(make_store):
    syn = make_store(["lance"], n_tokens=90_000, shard_tokens=10_000)
    store = open_store(syn.path)
    fragments = store.manifest.splits["train"].formats["lance"]
    chunks, _ = chunks_of(fragments)
    assert len(chunks) > len(fragments) > 1  # several ingest shards a fragment
    reader = store.reader("train", "lance")
    starts = _all_starts(len(syn.stream), 700, fragments)
    for batch in np.array_split(starts, 7):
        got = reader.windows(batch, 700)
        np.testing.assert_array_equal(got, syn.stream[batch[:, None] + np.arange(700)])
    assert reader._chunks is not None


def test_a_machine_decodes_each_shard_once(make_store, tmp_path):
    syn = make_store(["lance"], n_tokens=60_000, shard_tokens=10_000)
    store = open_store(syn.path)
    n_chunks = len(chunks_of(store.manifest.splits["train"].formats["lance"])[0])
    starts = np.arange(0, len(syn.stream) - 1000, 997)
    first = store.reader("train", "lance")
    first.windows(starts, 1000)
    copies = list((Path(os.environ["LMDATA_CACHE_DIR"]) / CACHE_SUBDIR).glob("*/*.bin"))
    assert len(copies) == n_chunks  # one copy per ingest shard
    second = open_store(syn.path).reader("train", "lance")  # another process would see the same
    takes = _count_takes(second)
    np.testing.assert_array_equal(second.windows(starts, 1000), syn.stream[starts[:, None] + np.arange(1000)])
    assert takes == []  # read from the copies, no take


def test_a_damaged_copy_is_decoded_again(make_store):
    syn = make_store(["lance"], n_tokens=40_000, shard_tokens=10_000)
    starts = np.array([0, 5_000, 20_000, 30_000])
    open_store(syn.path).reader("train", "lance").windows(starts, 500)
    copy = sorted((Path(os.environ["LMDATA_CACHE_DIR"]) / CACHE_SUBDIR).glob("*/*.bin"))[0]
    raw = bytearray(copy.read_bytes())
    raw[100] ^= 0xFF
    copy.write_bytes(bytes(raw))
    reader = open_store(syn.path).reader("train", "lance")
    got = reader.windows(np.arange(0, len(syn.stream) - 600, 599), 600)
    np.testing.assert_array_equal(got, syn.stream[np.arange(0, len(syn.stream) - 600, 599)[:, None] + np.arange(600)])


def test_a_copy_made_again_checks_every_row_again(make_store):
    """A copy made a second time in one process (evicted, or dropped as damaged) checks its rows'
    CRC-32s again: rows this process checked once must not vouch for what a later take returns."""
    syn = make_store(["lance"], n_tokens=40_000, shard_tokens=10_000)
    reader = open_store(syn.path).reader("train", "lance")
    np.testing.assert_array_equal(reader.windows(np.array([100]), 500)[0], syn.stream[100:600])
    chunks = reader._chunks
    frag = reader.shards[0]
    path = syn.path / "train" / "lance" / frag.files[0].path
    data = bytearray(path.read_bytes())
    flip_stored_token(data, syn.stream, 300)  # in rows the first read checked
    path.write_bytes(bytes(data))
    chunks.copies.drop(chunks.copies.path(chunks._copy_keys[0], chunks.dtype))
    with pytest.raises(LmdataError, match=f"shard {frag.name} row \\d+ fails its CRC-32"):
        chunks._fetch(0)


def test_budget_zero_reads_by_takes(make_store, monkeypatch):
    monkeypatch.setenv("LMDATA_LANCE_CACHE_BYTES", "0")
    syn = make_store(["lance"], n_tokens=40_000, shard_tokens=10_000)
    reader = open_store(syn.path).reader("train", "lance")
    takes = _count_takes(reader)
    starts = np.array([0, 12_345, 30_000])
    np.testing.assert_array_equal(reader.windows(starts, 800), syn.stream[starts[:, None] + np.arange(800)])
    assert reader._chunks is None and takes == [1]


def test_a_reader_left_is_freed_at_once_with_its_lock(make_store):
    """No reference cycle through the copies: dropping the reader releases the store's readers' lock
    without a garbage collection (an ingest into the store right after would be refused)."""
    import gc
    import weakref

    from lmdata.store import readlock

    syn = make_store(["lance"], n_tokens=40_000, shard_tokens=10_000)
    reader = open_store(syn.path).reader("train", "lance")
    reader.windows(np.array([0, 20_000]), 100)
    key = os.path.realpath(syn.path)
    assert reader._chunks is not None and key in readlock._held
    gone = weakref.ref(reader)
    gc.disable()
    try:
        del reader
        assert gone() is None and key not in readlock._held
    finally:
        gc.enable()


READ_AND_TELL = """
import sys, numpy as np
from lmdata.store import open_store
reader = open_store(sys.argv[1]).reader("train", "lance")
reader.windows(np.arange(0, 30_000, 1_000), 500)
print("lance" in sys.modules, reader.fork_safe)
"""


def test_a_process_reading_only_copies_never_starts_lance(make_store):
    """The first process makes the copies (and so runs Lance); the next reads them without importing
    Lance at all: no runtime started, so a loader may fork its workers."""
    import subprocess
    import sys

    syn = make_store(["lance"], n_tokens=40_000, shard_tokens=10_000)
    runs = [subprocess.run([sys.executable, "-c", READ_AND_TELL, str(syn.path)], capture_output=True, text=True,
                           timeout=120) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr
    assert [r.stdout.split() for r in runs] == [["True", "False"], ["False", "True"]]
