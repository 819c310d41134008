"""Remote shards read from whole copies on the machine (``store/formats/shard_copies.py``): what
they cost in requests and bytes (counted at a proxy in front of the S3 server, never time), that
the machine's processes share them, that damage is caught, that nothing waits at exit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections import namedtuple

import numpy as np
import pytest

from lmdata.bench.delay_proxy import DelayProxy
from lmdata.errors import LmdataError
from lmdata.io import cache
from lmdata.ingest.publish import publish
from lmdata.io.location import location
from lmdata.store import open_store

BATCHES, BATCH, SEQ = 50, 4, 64
SHARD_TOKENS = 16_000  # 32 KiB shard objects


def _published(store_builder, tmp_path, s3, name: str, n_tokens: int, formats=("memmap",),
               shard_tokens: int = SHARD_TOKENS) -> tuple[str, object]:
    """A store built locally and uploaded to ``s3``: its URI and the local store."""
    local = tmp_path / "store"
    store_builder(local, list(formats), n_tokens=n_tokens, shard_tokens=shard_tokens)
    uri = s3.uri(name)
    publish(local, location(uri))
    return uri, local


def test_copies_fetch_each_shard_once_per_machine(store_builder, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    uri, local = _published(store_builder, tmp_path, s3, "copies", 160_000)
    here = open_store(local).dataset("train", SEQ)
    order = np.random.default_rng(0).permutation(len(here))[: BATCHES * BATCH]
    with DelayProxy(s3.server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        costs = []
        for _ in range(2):  # two readers (processes, ranks) on one machine
            ds = open_store(uri).dataset("train", SEQ)
            before = proxy.requests, proxy.sent_bytes
            for b in range(BATCHES):
                got = ds.batch(order[b * BATCH:(b + 1) * BATCH])
                assert np.array_equal(got, here.batch(order[b * BATCH:(b + 1) * BATCH]))
            costs.append((proxy.requests - before[0], proxy.sent_bytes - before[1]))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.server.endpoint)
    shards = sorted((local / "train" / "memmap").glob("tokens-*.bin"))
    touched = {int(np.searchsorted(here.reader._shard_bounds, k * SEQ, side="right")) - 1 for k in order}
    (first_req, first_bytes), (second_req, second_bytes) = costs
    assert len(touched) == len(shards)  # 200 windows over 10 shards
    assert first_req == 2 * len(shards), costs  # a shard: pyarrow's HEAD and one GET (checked by its checksum: no sidecar)
    assert sum(p.stat().st_size for p in shards) <= first_bytes < 1.1 * sum(p.stat().st_size for p in shards)
    assert second_req == 0 and second_bytes == 0, costs  # the second reader reads the machine's copies
    assert list((tmp_path / "cache" / "memmap").glob("*/*.bin.crc"))


def test_a_split_over_the_copies_budget_is_read_by_ranges(store_builder, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    uri, local = _published(store_builder, tmp_path, s3, "budget", 160_000)
    monkeypatch.setenv("LMDATA_MEMMAP_CACHE_BYTES", str(100_000))  # under the split's ~320 KB
    ds, here = open_store(uri).dataset("train", SEQ), open_store(local).dataset("train", SEQ)
    assert ds.reader.copies is None
    assert np.array_equal(ds.batch(np.arange(0, len(ds), 97)), here.batch(np.arange(0, len(ds), 97)))
    assert not (tmp_path / "cache" / "memmap").exists()
    monkeypatch.delenv("LMDATA_MEMMAP_CACHE_BYTES")
    full = namedtuple("usage", "total used free")(10 << 30, (10 << 30) - (1 << 30), 1 << 30)
    with monkeypatch.context() as m:
        m.setattr(cache.shutil, "disk_usage", lambda _: full)  # a tenth of the disk left: no copies
        m.delenv(cache.KEEP_FREE_ENV)  # (the suite's setting: the default tenth here)
        assert open_store(uri).dataset("train", SEQ).reader.copies is None
    monkeypatch.setenv("LMDATA_MEMMAP_CACHE_BYTES", "lots")
    with pytest.raises(LmdataError, match="LMDATA_MEMMAP_CACHE_BYTES='lots': give a number of bytes"):
        open_store(uri).dataset("train", SEQ)


def test_a_damaged_copy_is_fetched_again_and_a_damaged_object_refused(store_builder, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    uri, local = _published(store_builder, tmp_path, s3, "damaged", 40_000)
    here = open_store(local).dataset("train", SEQ)
    every = np.arange(len(here))
    assert np.array_equal(open_store(uri).dataset("train", SEQ).batch(every), here.batch(every))
    for copy in (tmp_path / "cache" / "memmap").glob("*/*.bin"):  # a bit flipped in every copy on this machine
        raw = bytearray(copy.read_bytes())
        raw[len(raw) // 2] ^= 0x40
        copy.write_bytes(bytes(raw))
    assert np.array_equal(open_store(uri).dataset("train", SEQ).batch(every), here.batch(every))
    shutil.rmtree(tmp_path / "cache" / "memmap")
    name = sorted((local / "train" / "memmap").glob("tokens-*.bin"))[1].name
    obj = location(f"{uri}/train/memmap/{name}")
    raw = bytearray(obj.read_bytes())
    raw[100] ^= 0x01
    obj.write_bytes(bytes(raw))
    with pytest.raises(LmdataError, match=f"{name}: shard 00001 fails its xxh128 checksum"):
        open_store(uri).dataset("train", SEQ).batch(every)


_ONE_BATCH = """
import sys
import numpy as np
from lmdata.store import open_store
ds = open_store(sys.argv[1]).dataset("train", 64)
print(ds.batch(np.arange(0, len(ds), len(ds) // 8)[:8]).sum())
"""


def test_a_script_exits_at_once_and_silently_while_shards_are_fetched_behind_it(store_builder, tmp_path, s3):
    """The background fetch of the rest of the split is daemon threads: a plain script that reads one
    batch and ends neither waits for the split nor prints anything at exit (piped output), nor dies
    in Lance's native take at exit (each background fetch finishes its shard first)."""
    uri, local = _published(store_builder, tmp_path, s3, "exit", 400_000, ("memmap", "parquet", "lance"),
                            shard_tokens=4_000)  # 100 shards
    expected = open_store(local).dataset("train", 64)
    want = str(expected.batch(np.arange(0, len(expected), len(expected) // 8)[:8]).sum())
    for fmt in ("memmap", "parquet", "lance"):
        script = _ONE_BATCH.replace('"train", 64)', f'"train", 64, format="{fmt}")')
        env = {**os.environ, "LMDATA_CACHE_DIR": str(tmp_path / f"cache-{fmt}")}
        done = subprocess.run([sys.executable, "-c", script, uri], capture_output=True, text=True, env=env,
                              timeout=120)
        assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
        assert done.stdout.strip() == want
        copies = list((tmp_path / f"cache-{fmt}" / (fmt if fmt != "lance" else "lance-tokens")).glob("*/*.bin"))
        assert 0 < len(copies) <= 100  # (Lance: a copy per run of its small shards)


def test_the_rest_of_the_split_is_fetched_in_the_background(store_builder, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    uri, local = _published(store_builder, tmp_path, s3, "mirror", 160_000)
    ds = open_store(uri).dataset("train", SEQ)
    ds.batch([0])  # one window of the first shard
    for t in [t for t in threading.enumerate() if t.name.startswith("lmdata-mirror")]:  # some may be done
        assert t.daemon
        t.join(60)
    copies = list((tmp_path / "cache" / "memmap").glob("*/*.bin"))
    assert len(copies) == len(list((local / "train" / "memmap").glob("tokens-*.bin")))
    with DelayProxy(s3.server.endpoint) as proxy:  # every window is now read from the machine's copies
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        everything = np.arange(len(ds))
        assert np.array_equal(ds.batch(everything), open_store(local).dataset("train", SEQ).batch(everything))
        assert proxy.requests == 0


def test_the_background_fetch_lets_its_reader_go_and_then_stops(store_builder, tmp_path, s3, monkeypatch):
    """The mirror threads hold the reader only inside a fetch: a reader dropped is collected, and its
    threads end after the shard they are on (they had kept every reader of the split, and run, until exit)."""
    import gc
    import weakref

    from lmdata.store.formats.memmap import MemmapReader

    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    uri, _ = _published(store_builder, tmp_path, s3, "mirror-gc", 160_000)
    gate, calls, batch_reader = threading.Event(), [], []
    real_fetch = MemmapReader._fetch_once

    def fetch(i, keep=False):  # static: a mirror thread blocked here holds no reader; the batch's own are real
        if not threading.current_thread().name.startswith("lmdata-mirror"):
            return real_fetch(batch_reader[0], i, keep)
        calls.append(i)
        gate.wait(60)

    monkeypatch.setattr(MemmapReader, "_fetch_once", staticmethod(fetch))
    ds = open_store(uri).dataset("train", SEQ)
    batch_reader.append(ds.reader)
    ds.batch([0])  # the first batch starts the background fetch of the rest
    batch_reader.clear()
    threads = [t for t in threading.enumerate() if t.name.startswith("lmdata-mirror")]
    assert threads
    reader = weakref.ref(ds.reader)
    del ds
    gc.collect()
    assert reader() is None  # collected while its mirror threads wait between two of its shards
    gate.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert len(calls) <= len(threads)  # each stopped after the shard it was on


_READ_ALL = """
import sys, time
from pathlib import Path
import numpy as np
from lmdata.store import open_store
ds = open_store(sys.argv[1]).dataset("train", 64)
while not Path(sys.argv[2]).exists():  # both processes start reading together
    time.sleep(0.01)
for k in range(0, len(ds), 64):
    ds.batch(np.arange(k, min(len(ds), k + 64)))
print("ok")
"""


def test_processes_on_one_machine_fetch_each_shard_once_between_them(store_builder, tmp_path, s3):
    """Loader workers and ranks on one node share the machine's copies: while one process fetches a
    shard, another that needs it waits for that copy (a lock per copy) instead of fetching it too."""
    uri, local = _published(store_builder, tmp_path, s3, "shared", 1_600_000)  # 100 shards, 3.2 MB
    store_bytes = sum(p.stat().st_size for p in (local / "train" / "memmap").glob("tokens-*.bin"))
    go = tmp_path / "go"
    with DelayProxy(s3.server.endpoint, delay_ms=5) as proxy:
        env = {**os.environ, "LMDATA_CACHE_DIR": str(tmp_path / "cache"), "AWS_ENDPOINT_URL": proxy.url}
        procs = [subprocess.Popen([sys.executable, "-c", _READ_ALL, uri, str(go)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        try:
            time.sleep(3)  # both opened the store
            go.touch()
            outs = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs:
                p.kill()
        sent = proxy.sent_bytes
    assert all(p.returncode == 0 and out == "ok\n" for p, (out, _) in zip(procs, outs)), outs
    assert store_bytes <= sent < 1.2 * store_bytes, (sent, store_bytes)  # twice without the lock


def test_the_background_fetch_stops_once_the_cache_cannot_keep_copies(store_builder, tmp_path, s3, monkeypatch):
    """A read-only or full cache: the split is not fetched in the background to keep none of it."""
    from lmdata.store.formats import shard_copies
    from lmdata.store.formats.memmap import MemmapReader

    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(blocker / "cache"))  # makedirs fails, even as root
    uri, local = _published(store_builder, tmp_path, s3, "mirror-refused", 640_000)  # 40 shards
    fetched, real, mine = [], MemmapReader._fetch, []

    def fetch(self, i):  # this reader's fetches only (an earlier test's threads may still run)
        if self is mine[0]:
            fetched.append(i)
        return real(self, i)

    monkeypatch.setattr(MemmapReader, "_fetch", fetch)
    ds = open_store(uri).dataset("train", SEQ)
    mine.append(ds.reader)
    assert ds.reader.copies is not None
    with pytest.warns(RuntimeWarning, match="cannot keep copies of memmap shards here"):
        got = ds.batch([0])
        for t in [t for t in threading.enumerate() if t.name.startswith("lmdata-mirror")]:
            t.join(60)
    assert np.array_equal(got, open_store(local).dataset("train", SEQ).batch([0]))
    # the batch's shard once (its prefetch's tokens are kept for it) and each mirror thread's first: was every shard
    assert len(fetched) <= 1 + shard_copies.MIRROR_FETCHES < len(ds.reader.shards)


def test_workers_forked_after_the_parent_read_a_batch_read_the_same_batches(store_builder, tmp_path, s3, monkeypatch):
    """The parent's first batch started the background fetch; the loader forks its workers with the
    fetches paused (``io.background.paused``: no fork copies an S3 call in flight) and they read on."""
    import multiprocessing as mp

    from lmdata.data import make_loader
    from lmdata.io import background

    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    uri, local = _published(store_builder, tmp_path, s3, "fork-after-read", 320_000)
    ds = open_store(uri).dataset("train", SEQ)
    ds.batch([0])  # the mirror threads start
    pauses, real = [], background.paused
    monkeypatch.setattr(background, "paused", lambda: (pauses.append(True), real())[1])
    got = [x.numpy().copy() for _, (x, _) in zip(range(20), make_loader(
        ds, 8, num_workers=2, seed=3, start_method="fork" if "fork" in mp.get_all_start_methods() else None))]
    want = [x.numpy().copy() for _, (x, _) in zip(range(20), make_loader(
        open_store(local).dataset("train", SEQ), 8, num_workers=0, seed=3))]
    assert len(got) == 20 and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert pauses == [True]
