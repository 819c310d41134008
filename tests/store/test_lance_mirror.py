"""A remote Lance split is copied to the machine in the background, then read from the copy
(``store/formats/lance_mirror.py``): same windows, no more requests, a damaged object never copied."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from lmdata.bench.delay_proxy import DelayProxy
from lmdata.ingest.publish import publish
from lmdata.io.location import location
from lmdata.store import open_store
from lmdata.store.formats.lance_mirror import COMPLETE

SEQ = 64


def _join_mirrors() -> None:
    for t in [t for t in threading.enumerate() if t.name == "lmdata-lance-mirror"]:
        assert t.daemon
        t.join(120)


@pytest.fixture()
def remote_lance(store_builder, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    local = tmp_path / "store"
    store_builder(local, ["lance"], n_tokens=200_000, shard_tokens=50_000)
    uri = s3.uri("lance")
    publish(local, location(uri))
    return uri, open_store(local).dataset("train", SEQ, format="lance")


def test_batches_are_read_from_the_machines_copy_once_it_is_whole(remote_lance, tmp_path, s3, monkeypatch):
    uri, here = remote_lance
    ds = open_store(uri).dataset("train", SEQ, format="lance")
    every = np.arange(len(ds))
    assert np.array_equal(ds.batch(every[:32]), here.batch(every[:32]))  # remote, and the copy starts
    assert ds.reader._on_copy is None
    _join_mirrors()
    (done,) = (tmp_path / "cache" / "lance").glob(f"*/{COMPLETE}")
    expected = here.batch(every)  # (the local store's own decoded copies made here)
    copies = lambda: set((tmp_path / "cache" / "lance-tokens").glob("*/*.bin"))  # noqa: E731
    before = copies()
    assert np.array_equal(ds.batch(every), expected)
    assert ds.reader._on_copy == done.parent
    # windows now come from decoded copies of the ingest shards, made from the machine's copy
    assert ds.reader._chunks and ds.reader._chunks._dir == str(done.parent)
    assert len(copies() - before) == len(ds.reader._chunks.shards) == 4
    with DelayProxy(s3.server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        assert np.array_equal(ds.batch(every[::-7]), here.batch(every[::-7]))
        assert proxy.requests == 0
        again = open_store(uri).dataset("train", SEQ, format="lance")  # another process of this machine
        assert np.array_equal(again.batch(every[:64]), here.batch(every[:64]))
        assert again.reader._on_copy == done.parent


def test_a_damaged_object_is_never_copied_and_reads_stay_remote(remote_lance, tmp_path, s3, monkeypatch):
    uri, here = remote_lance
    ds = open_store(uri).dataset("train", SEQ, format="lance")
    data = [s.files[0].path for s in ds.reader.shards]
    obj = location(f"{uri}/train/lance/{data[-1]}")
    raw = bytearray(obj.read_bytes())
    raw[len(raw) // 3] ^= 0x10
    obj.write_bytes(bytes(raw))
    assert np.array_equal(ds.batch([0, 1]), here.batch([0, 1]))  # rows far from the flipped byte
    _join_mirrors()
    assert not list((tmp_path / "cache" / "lance").glob(f"*/{COMPLETE}"))
    assert np.array_equal(ds.batch([2, 3]), here.batch([2, 3])) and ds.reader._on_copy is None  # still remote


def test_no_copy_over_the_budget(remote_lance, tmp_path, monkeypatch):
    uri, here = remote_lance
    monkeypatch.setenv("LMDATA_LANCE_CACHE_BYTES", "1000")
    ds = open_store(uri).dataset("train", SEQ, format="lance")
    assert np.array_equal(ds.batch(np.arange(10)), here.batch(np.arange(10)))
    assert ds.reader._mirror is None and not (tmp_path / "cache" / "lance").exists()
