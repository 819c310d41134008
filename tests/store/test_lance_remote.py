"""A Lance split on object storage is read from decoded copies of its ingest shards, each made by one
remote take (``store/formats/lance_chunks.py`` over ``shard_copies``): same windows, no request once the
machine has the copies, a damaged row never copied, and the budget 0 reads by remote takes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from lmdata.bench.delay_proxy import DelayProxy
from lmdata.errors import LmdataError
from lmdata.ingest.publish import publish
from lmdata.io.location import location
from lmdata.store import open_store

from lance_bytes import flip_stored_token

SEQ = 64


def _join_background_fetches() -> None:
    for t in [t for t in threading.enumerate() if t.name.startswith("lmdata-mirror")]:
        assert t.daemon
        t.join(120)


def _copies(tmp_path) -> set:
    return set((tmp_path / "cache" / "lance-tokens").glob("*/*.bin"))


@pytest.fixture()
def remote_lance(store_builder, tmp_path, s3, monkeypatch):
    """A 4-shard Lance split in 2 fragments of 2 shards, published to moto; the local store's reader."""
    from lmdata.store.formats import lance_fragments

    monkeypatch.setattr(lance_fragments, "FRAGMENT_TOKENS", 120_000)
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    local = tmp_path / "store"
    syn = store_builder(local, ["lance"], n_tokens=200_000, shard_tokens=50_000)
    uri = s3.uri("lance")
    publish(local, location(uri))
    here = open_store(local).dataset("train", SEQ, format="lance")
    assert [len(s.extra["members"]) for s in here.reader.shards] == [2, 2]
    return uri, here, syn


def test_windows_come_from_copies_made_by_remote_takes(remote_lance, tmp_path, s3, monkeypatch):
    uri, here, _ = remote_lance
    every = np.arange(len(here))
    expected = here.batch(every)  # (the local store's own copies are made here, before counting)
    before = _copies(tmp_path)
    ds = open_store(uri).dataset("train", SEQ, format="lance")
    assert np.array_equal(ds.batch(every[:32]), expected[:32])
    chunks = ds.reader._chunks
    assert chunks is not None and chunks.remote
    # remote chunks join a fragment's small ingest shards (``REMOTE_CHUNK_TOKENS``): one take each
    assert [c.name for c in chunks.shards] == ["00000-00001", "00002-00003"]
    _join_background_fetches()  # the rest of the split, fetched in the background
    assert len(_copies(tmp_path) - before) == 2
    assert np.array_equal(ds.batch(every), expected)
    with DelayProxy(s3.server.endpoint) as proxy:  # another reader of this machine: copies only
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        again = open_store(uri)  # (the manifest and a LIST: requests of its own)
        opened = proxy.requests
        assert np.array_equal(again.dataset("train", SEQ, format="lance").batch(every[::-7]), expected[::-7])
        assert proxy.requests == opened


def test_a_damaged_row_is_refused_naming_the_shard_and_never_copied(remote_lance, tmp_path, monkeypatch):
    uri, here, syn = remote_lance
    reader = open_store(uri).reader("train", "lance")
    frag = reader.shards[1]
    member = frag.extra["members"][1]  # the second ingest shard of the second fragment
    first = frag.first_token + frag.n_tokens - member["n_tokens"]
    middle = first + member["n_tokens"] // 2
    obj = location(f"{uri}/train/lance/{frag.files[0].path}")
    raw = bytearray(obj.read_bytes())
    flip_stored_token(raw, syn.stream, middle)
    obj.write_bytes(bytes(raw))
    monkeypatch.setattr("lmdata.store.formats.shard_copies.MIRROR_FETCHES", 0)  # only what batches need
    ds = open_store(uri).reader("train", "lance")
    sound = np.array([5, reader.shards[0].n_tokens - 150])  # the first fragment's chunk
    np.testing.assert_array_equal(ds.windows(sound, 100), syn.stream[sound[:, None] + np.arange(100)])
    before = _copies(tmp_path)
    for _ in range(2):  # refused every time, naming the shard
        with pytest.raises(LmdataError, match=f"{frag.files[0].path}: shard {frag.name} row \\d+ fails its CRC-32"):
            ds.windows(np.array([middle - 20]), 100)
    assert _copies(tmp_path) == before  # nothing of the damaged shard was written


def test_the_budget_0_reads_by_remote_takes(remote_lance, tmp_path, monkeypatch):
    uri, here, syn = remote_lance
    monkeypatch.setenv("LMDATA_LANCE_CACHE_BYTES", "0")
    ds = open_store(uri).dataset("train", SEQ, format="lance")
    assert np.array_equal(ds.batch(np.arange(10)), here.batch(np.arange(10)))
    assert ds.reader._chunks is None and not (tmp_path / "cache" / "lance-tokens").exists()
