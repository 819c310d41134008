"""Integrity that costs what you read, for a remote memmap store read by ranges (the machine's
copies off, or a split over their budget; the copies: test_shard_copies.py): the first 50
batches of a store 10x larger download about what they download from a small one (counted at a
proxy in front of the S3 server: requests and response bytes, never time). Requests grow with
the shards the batches touch, never past a bound set by the windows read."""

from __future__ import annotations

import numpy as np

from lmdata.bench.delay_proxy import DelayProxy
from lmdata.store import open_store
from lmdata.ingest.publish import publish
from lmdata.io.location import location

BATCHES, BATCH, SEQ = 50, 4, 64
SHARD_TOKENS = 16_000  # 32 KiB shard objects: moto reads a whole object per ranged GET


def _cost(store_builder, tmp_path, s3, monkeypatch, name, n_tokens):
    local = tmp_path / name
    store_builder(local, ["memmap"], n_tokens=n_tokens, shard_tokens=SHARD_TOKENS)
    uri = s3.uri(name)
    publish(local, location(uri))
    with DelayProxy(s3.server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        ds = open_store(uri).dataset("train", SEQ)
        before = proxy.requests, proxy.sent_bytes  # opening: one GET (the manifest), no LIST
        order = np.random.default_rng(0).permutation(len(ds))[: BATCHES * BATCH]
        for b in range(BATCHES):  # a shuffled epoch's first batches, as the loader reads them
            ds.batch(order[b * BATCH:(b + 1) * BATCH])
        cost = proxy.requests - before[0], proxy.sent_bytes - before[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.server.endpoint)
    return cost, sum(f.stat().st_size for f in (local / "train" / "memmap").glob("tokens-*.bin"))


def test_first_50_batches_of_a_10x_store_cost_what_they_cost_on_a_small_one(store_builder, tmp_path, s3, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LMDATA_MEMMAP_CACHE_BYTES", "0")  # read by ranges
    (small_req, small_bytes), small_size = _cost(store_builder, tmp_path, s3, monkeypatch, "small", 160_000)
    (big_req, big_bytes), big_size = _cost(store_builder, tmp_path, s3, monkeypatch, "big", 1_600_000)
    assert big_size > 9 * small_size
    print(f"small store {small_size} B: {small_req} requests, {small_bytes} B; "
          f"10x store {big_size} B: {big_req} requests, {big_bytes} B")
    # bytes: the blocks under each batch's windows (merged per shard) plus each touched shard's
    # small checksum file; they do not grow with the store. A whole-shard hash per process (the
    # old first-use check) would download every shard touched: ~all of the 10x store here.
    assert big_bytes < 1.5 * small_bytes and big_bytes < 0.75 * big_size, (small_bytes, big_bytes)
    # requests: at most one ranged GET per shard a batch touches (windows of one shard merge),
    # plus, once per process and shard touched, its open (a HEAD) and its checksum file (a GET):
    # bounded by the windows read, whatever the store's size (here 100 shards vs 10)
    windows = BATCHES * BATCH
    assert small_req <= 3 * windows and big_req <= 3 * windows, (small_req, big_req, windows)


def test_a_batch_loads_its_shards_checksum_files_at_once(store_builder, tmp_path, s3, monkeypatch):
    """A shuffled batch of a store of small shards meets one new shard per window: their sidecars are
    fetched on the range reader's threads together, not one request after another."""
    import threading

    from lmdata.store.formats.memmap_blocks import BlockReads

    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LMDATA_MEMMAP_CACHE_BYTES", "0")  # read by ranges
    local = tmp_path / "many"
    store_builder(local, ["memmap"], n_tokens=160_000, shard_tokens=SHARD_TOKENS)
    uri = s3.uri("many")
    publish(local, location(uri))
    loaded, sums = [], BlockReads.sums
    monkeypatch.setattr(BlockReads, "sums", lambda self, i: loaded.append(threading.current_thread().name) or
                        sums(self, i))
    ds = open_store(uri).dataset("train", SEQ)
    starts = np.arange(0, 160_000 - SEQ, SHARD_TOKENS)  # one window in each shard
    local_ds = open_store(local).dataset("train", SEQ)
    assert np.array_equal(ds.batch(np.arange(len(starts)) * (SHARD_TOKENS // SEQ)),
                          local_ds.batch(np.arange(len(starts)) * (SHARD_TOKENS // SEQ)))
    fetched = [name for name in loaded if name.startswith("lmdata-range")]
    assert len(set(fetched)) > 1 and len(fetched) >= len(starts) - 1, loaded
