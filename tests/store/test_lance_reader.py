"""The Lance reader: one ``take`` per batch over a few large fragments, windows across fragments."""

from __future__ import annotations

import os
import subprocess
import sys

import lance
import numpy as np
import pytest

from lmdata.errors import LmdataError
from lmdata.store import open_store
from lmdata.store.formats import lance as lance_format, lance_fragments, lance_uring


@pytest.fixture(autouse=True)
def by_takes(monkeypatch):
    """This module tests the take path (io_uring, fork safety, one take a batch); the default local
    path, the machine's decoded copies, is tests/store/test_lance_chunks.py's."""
    monkeypatch.setenv("LMDATA_LANCE_CACHE_BYTES", "0")


def test_fragments_are_runs_of_whole_shards_up_to_the_limit(make_store):
    syn = make_store(["lance", "memmap"], n_tokens=70_000)
    formats = open_store(syn.path).manifest.splits["train"].formats
    fragments, shards = formats["lance"], formats["memmap"]
    assert 1 < len(fragments) < len(shards)
    held = [m["name"] for f in fragments for m in f.extra.get("members", [{"name": f.name}])]
    assert held == [s.name for s in shards]  # every shard once, in order
    for f in fragments:
        assert f.n_tokens <= lance_fragments.FRAGMENT_TOKENS or len(f.extra.get("members", [])) <= 1
        assert f.name == (f.extra["members"][0]["name"] + "-" + f.extra["members"][-1]["name"]
                          if "members" in f.extra else f.name)
    fdir = syn.path / "train" / "lance"
    assert len(lance.dataset(str(fdir)).get_fragments()) == len(fragments)
    assert sorted(p.name for p in (fdir / "data").iterdir()) == sorted(f.files[0].path[5:] for f in fragments)
    # staging records of grouped shards are gone; what is left is one record per fragment
    records = [p.stem for p in (fdir / "_shards").glob("*.json")] + [p.stem for p in (fdir / "_fragments").glob("*.json")]
    assert sorted(records) == sorted(f.name for f in fragments)


def test_windows_across_fragments_read_with_one_take_per_batch(make_store):
    syn = make_store(["lance"], n_tokens=70_000)
    store = open_store(syn.path)
    reader = store.reader("train", "lance")
    bounds = [f.first_token for f in store.manifest.splits["train"].formats["lance"][1:]]
    ds = reader._open()
    takes = []

    class Counting:
        def __getattr__(self, name):
            return getattr(ds, name)

        def take(self, *args, **kwargs):
            takes.append(1)
            return ds.take(*args, **kwargs)

    reader._ds = Counting()
    starts = np.array([0, *(b - 300 for b in bounds), *(b - 1 for b in bounds), len(syn.stream) - 700])
    got = reader.windows(starts, 700)  # windows that straddle every fragment boundary, in one batch
    np.testing.assert_array_equal(got, syn.stream[starts[:, None] + np.arange(700)])
    assert len(takes) == 1
    rng = np.random.default_rng(1)
    for _ in range(5):
        starts = rng.integers(0, len(syn.stream) - 1025, size=32)
        np.testing.assert_array_equal(reader.windows(starts, 1025), syn.stream[starts[:, None] + np.arange(1025)])
    for doc in (0, 7, len(syn.doc_starts) - 2):
        np.testing.assert_array_equal(reader.document(doc), syn.stream[syn.doc_starts[doc]:syn.doc_starts[doc + 1]])


def test_doc_starts_per_fragment_tile_the_split(make_store):
    syn = make_store(["lance"], n_tokens=70_000)
    store = open_store(syn.path)
    reader = store.reader("train", "lance")
    starts = [reader.doc_starts(i)[:-1] + f.first_token
              for i, f in enumerate(store.manifest.splits["train"].formats["lance"])]
    np.testing.assert_array_equal(np.concatenate(starts), syn.doc_starts[:-1])


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_rows_hold_the_contract_columns_and_takes_read_tokens(make_store, dtype):
    """Ingest writes the contract's columns alone (no ``token_bytes`` since the loader reads decoded
    copies), records its layout, and a take reads ``tokens``."""
    syn = make_store(["lance"], dtype=dtype, n_tokens=30_000)
    table = lance.dataset(str(syn.path / "train" / "lance")).to_table()
    assert table.schema.names == ["doc_id", "token_offset", "tokens"]
    store = open_store(syn.path)
    assert all(s.extra["columns"] == table.schema.names for s in store.manifest.splits["train"].formats["lance"])
    reader = store.reader("train", "lance")
    starts = np.random.default_rng(2).integers(0, len(syn.stream) - 500, size=16)
    got = reader.windows(starts, 500)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, syn.stream[starts[:, None] + np.arange(500)])
    assert reader._column == "tokens"
    assert reader.alternates() == {}  # one encoding: nothing for verify to compare


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_a_store_an_earlier_lmdata_wrote_with_token_bytes_reads_through_them(make_store, earlier_lance_layout, dtype):
    """Stores written with ``token_bytes`` stay readable as they were: takes read that column, and
    verify compares it with ``tokens``."""
    earlier_lance_layout()
    syn = make_store(["lance"], dtype=dtype, n_tokens=30_000)
    table = lance.dataset(str(syn.path / "train" / "lance")).to_table()
    assert table.schema.names == ["doc_id", "token_offset", "tokens", "token_bytes"]
    for tokens, raw in zip(table.column("tokens").to_pylist(), table.column("token_bytes").to_pylist()):
        assert np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).tolist() == tokens
    reader = open_store(syn.path).reader("train", "lance")
    starts = np.random.default_rng(3).integers(0, len(syn.stream) - 700, size=16)
    np.testing.assert_array_equal(reader.windows(starts, 700), syn.stream[starts[:, None] + np.arange(700)])
    assert reader._column == "token_bytes"
    assert list(reader.alternates()) == ["tokens column"]
    np.testing.assert_array_equal(reader.document(3), syn.stream[syn.doc_starts[3]:syn.doc_starts[4]])


def _windows(syn, reader, seed=4, n=24, length=900, reader_out=False):
    starts = np.random.default_rng(seed).integers(0, len(syn.stream) - length, size=n)
    got = reader.windows(starts, length)
    np.testing.assert_array_equal(got, syn.stream[starts[:, None] + np.arange(length)])
    return reader if reader_out else got


def test_io_modes_read_the_same_windows(tmp_path, store_builder, monkeypatch):
    """io_uring where it works (the default on Linux), plain files on request; a path Lance must unquote."""
    monkeypatch.delenv(lance_format.IO_ENV, raising=False)
    monkeypatch.setattr(lance_uring, "_uring", None)  # this process has not probed yet
    simple = store_builder(tmp_path / "simple", ["lance"], n_tokens=20_000)
    if not _windows(simple, open_store(simple.path).reader("train", "lance"), reader_out=True)._ds.uri.startswith("file+uring"):
        pytest.skip("Lance's io_uring reader does not work on this machine")
    syn = store_builder(tmp_path / "a b%20c", ["lance"], n_tokens=40_000)
    store = open_store(syn.path)
    plain = store.reader("train", "lance", io="file")
    _windows(syn, plain)
    assert not plain._ds.uri.startswith("file+uring")
    auto = store.reader("train", "lance")
    assert auto.io == "auto"
    _windows(syn, auto)
    assert auto._ds.uri.startswith("file+uring://")  # the quoted path opened the right dataset
    uring = store.reader("train", "lance", io="uring")
    _windows(syn, uring)
    np.testing.assert_array_equal(uring.document(5), syn.stream[syn.doc_starts[5]:syn.doc_starts[6]])


def test_bad_io_mode_is_named(make_store, monkeypatch):
    syn = make_store(["lance"], n_tokens=20_000)
    with pytest.raises(LmdataError, match="io 'mmap'.*auto, uring, file"):
        open_store(syn.path).reader("train", "lance", io="mmap")
    monkeypatch.setenv(lance_format.IO_ENV, "fast")
    with pytest.raises(LmdataError, match="LMDATA_LANCE_IO"):
        open_store(syn.path).reader("train", "lance")


FALLBACK = """
import sys, warnings
import numpy as np
from lmdata.errors import LmdataError
from lmdata.store import open_store
store = open_store(sys.argv[1])
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    reader = store.reader("train", "lance")
    got = reader.windows(np.array([0, 1000, 5000]), 700)
print("warned" if any("io_uring reader does not work" in str(w.message) for w in caught) else "silent")
print("plain" if not reader._ds.uri.startswith("file+uring") else "uring")
print(got.sum())
try:
    store.reader("train", "lance", io="uring").windows(np.array([0]), 10)
except LmdataError as exc:
    print("refused:", exc)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="io_uring is Linux's; elsewhere auto reads plain files")
def test_a_machine_without_io_uring_falls_back_to_plain_files(make_store):
    """Where io_uring is forbidden, Lance fails each read (no hang): ``auto`` warns and reads plain files."""
    syn = make_store(["lance"], n_tokens=20_000)
    env = {**os.environ, "LANCE_URING_THREAD_COUNT": "0"}  # Lance's own knob: no ring, as under a strict seccomp
    env.pop(lance_format.IO_ENV, None)
    out = subprocess.run([sys.executable, "-c", FALLBACK, str(syn.path)], check=False, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    starts = np.array([0, 1000, 5000])
    expected = int(syn.stream[starts[:, None] + np.arange(700)].astype(np.int64).sum())
    assert lines[:3] == ["warned", "plain", str(expected)]
    assert "refused:" in lines[3] and "LMDATA_LANCE_IO=file" in lines[3]


FORKS = """
import multiprocessing as mp, sys, numpy as np
from lmdata.store import open_store
from lmdata.errors import LmdataError

def child(path, queue):
    try:
        queue.put(open_store(path).reader("train", "lance").windows(np.array([10]), 400)[0].tolist())
    except LmdataError as exc:
        queue.put("refused: " + str(exc))

def in_child(method):
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(sys.argv[1], queue), daemon=True)
    proc.start()
    try:
        got = queue.get(timeout=60)
    finally:
        proc.kill()
    print(got == expected if isinstance(got, list) else got)

if __name__ == "__main__":
    expected = open_store(sys.argv[1]).reader("train", "memmap").windows(np.array([10]), 400)[0].tolist()
    in_child("fork")  # Lance has not run here yet: a forked child opens it itself
    open_store(sys.argv[1]).reader("train", "lance").windows(np.array([0]), 10)
    in_child("fork")
    in_child("forkserver")
"""


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is Linux's")
def test_a_child_forked_after_lance_ran_refuses_naming_the_way_out(make_store, tmp_path):
    """Lance is not fork-safe: a child forked after it ran in the parent reads for a while or hangs for
    good (one CI run did), so it refuses, naming the way out; forked before, or from a forkserver, it reads."""
    syn = make_store(["memmap", "lance"], n_tokens=20_000)
    script = tmp_path / "forks.py"
    script.write_text(FORKS)
    out = subprocess.run([sys.executable, str(script), str(syn.path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    before, after, server = out.stdout.splitlines()
    assert (before, server) == ("True", "True")
    assert after.startswith("refused: ") and "forked after Lance ran in its parent" in after and "forkserver" in after


def test_damaged_data_is_not_taken_for_a_missing_io_uring(make_store, monkeypatch):
    """The probe take fails on plain files too: the reads name the shard, no io_uring warning."""
    import warnings

    monkeypatch.setattr(lance_uring, "_uring", None)
    syn = make_store(["lance"], n_tokens=20_000)
    shard = open_store(syn.path).manifest.splits["train"].formats["lance"][0]
    victim = syn.path / "train" / "lance" / shard.files[0].path
    data = bytearray(victim.read_bytes())
    data[-40:] = bytes(40)  # the file's footer: Lance cannot read it, the size still matches
    victim.write_bytes(bytes(data))
    reader = open_store(syn.path).reader("train", "lance", verify="size")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(LmdataError, match=f"shard {shard.name}"):
            reader.windows(np.array([0]), 100)
    assert lance_uring._uring in (None, True)


def test_row_crcs_replace_the_whole_file_hash_and_catch_a_flip_in_any_row(make_store, monkeypatch):
    """Lance 2.1 has no checksums of its own: each row's CRC-32 (in the checksummed row index)
    is checked on every row a take returns; the data file itself is never hashed by a reader."""
    from lmdata.store import checksum

    syn = make_store(["lance"], n_tokens=40_000)
    hashed = []
    real = checksum.digest_file
    monkeypatch.setattr(checksum, "digest_file", lambda p, *a: hashed.append(str(p)) or real(p, *a))
    store = open_store(syn.path)
    shards = store.manifest.splits["train"].formats["lance"]
    assert all(s.extra.get("row_crc") for s in shards)
    r = store.reader("train", "lance")
    np.testing.assert_array_equal(r.windows(np.array([0, 30_000]), 500), [syn.stream[:500], syn.stream[30_000:30_500]])
    assert not [p for p in hashed if p.endswith(".lance")]
    index = syn.path / "train" / "lance" / shards[0].files[-1].path  # the row index is checked against the manifest as read
    clean_index = index.read_bytes()
    index.write_bytes(clean_index[:-1] + bytes([clean_index[-1] ^ 1]))
    with pytest.raises(LmdataError, match=f"{shards[0].files[-1].path}: shard {shards[0].name} fails its xxh128"):
        open_store(syn.path).reader("train", "lance").windows(np.array([0]), 8)
    index.write_bytes(clean_index)
    shard = shards[-1]
    path = syn.path / "train" / "lance" / shard.files[0].path
    clean = path.read_bytes()
    for offset in (shard.first_token + 3, shard.first_token + shard.n_tokens // 3, len(syn.stream) - 8):
        data = bytearray(clean)
        context = syn.stream[offset - 1 : offset + 7].astype("<u2").tobytes()
        at = [i for i in range(len(data)) if data.startswith(context, i)]
        assert at, offset
        for i in at:  # every place these tokens are stored
            data[i + 2] ^= 0x01
        path.write_bytes(bytes(data))
        with pytest.raises(LmdataError, match=f"{shard.files[0].path}: shard {shard.name} row \\d+ fails its CRC-32"):
            open_store(syn.path).reader("train", "lance").windows(np.array([offset - 5]), 8)
    path.write_bytes(clean)
    np.testing.assert_array_equal(open_store(syn.path).reader("train", "lance").windows(np.array([len(syn.stream) - 8]), 8)[0],
                                  syn.stream[-8:])


def test_a_store_without_row_crcs_reads_and_hashes_its_data_on_first_touch(make_store, monkeypatch):
    """Lance stores written before row CRCs (a 2-row index): the whole-file checksum on first touch, as before."""
    import json

    from lmdata.store import checksum
    from lmdata.store.checksum import file_info

    syn = make_store(["lance"], n_tokens=30_000)
    manifest = json.loads((syn.path / "manifest.json").read_text())
    fmt_dir = syn.path / "train" / "lance"
    for shard in manifest["splits"]["train"]["formats"]["lance"]["shards"]:
        index = shard["files"][-1]
        np.save(fmt_dir / index["path"], np.load(fmt_dir / index["path"])[:2])
        info = file_info(fmt_dir, index["path"])
        index.update(bytes=info.bytes, xxh128=info.digest)
        shard["extra"].pop("row_crc")
    (syn.path / "manifest.json").write_text(json.dumps(manifest))
    hashed = []
    real = checksum.digest_file
    monkeypatch.setattr(checksum, "digest_file", lambda p, *a: hashed.append(str(p)) or real(p, *a))
    _windows(syn, open_store(syn.path).reader("train", "lance"))
    assert [p for p in hashed if p.endswith(".lance")]


def test_threads_meeting_a_fragment_first_load_its_row_index_once(make_store, monkeypatch):
    """A remote first batch starts 8 fetches and 4 background ones at once; each had loaded the same
    row index (a GET of 7 MB at 188 M tokens) before one was kept."""
    import threading
    import time

    syn = make_store(["lance"], n_tokens=20_000)
    reader = open_store(syn.path).reader("train", "lance")
    loads = []
    rows = lance_format.LanceReader._rows

    def slow_rows(self, i, sidecar_only=False):
        loads.append(i)
        time.sleep(0.05)  # a GET's time: every thread is inside before the first is done
        return rows(self, i, sidecar_only)

    monkeypatch.setattr(lance_format.LanceReader, "_rows", slow_rows)
    start = threading.Barrier(8)
    got = []

    def first_meeting():
        start.wait()
        got.append(reader._bounds(0))

    threads = [threading.Thread(target=first_meeting) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == [0] and len(got) == 8 and all(g is got[0] for g in got)
