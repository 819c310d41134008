"""The Lance reader: one ``take`` per batch over a few large fragments, windows across fragments."""

from __future__ import annotations

import lance
import pytest
import numpy as np

from lmdata.store import lance_fragments, open_store


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
def test_token_bytes_hold_each_rows_tokens(make_store, dtype):
    """The reader's column is the contract's ``tokens`` again, as little-endian bytes."""
    syn = make_store(["lance"], dtype=dtype, n_tokens=30_000)
    table = lance.dataset(str(syn.path / "train" / "lance")).to_table()
    assert table.schema.names == ["doc_id", "token_offset", "tokens", "token_bytes"]
    for tokens, raw in zip(table.column("tokens").to_pylist(), table.column("token_bytes").to_pylist()):
        assert np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<")).tolist() == tokens
    reader = open_store(syn.path).reader("train", "lance")
    starts = np.random.default_rng(2).integers(0, len(syn.stream) - 500, size=16)
    got = reader.windows(starts, 500)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, syn.stream[starts[:, None] + np.arange(500)])
    assert reader._column == "token_bytes"


def test_a_store_without_token_bytes_reads_through_tokens(make_store):
    """Stores written before ``token_bytes`` existed stay readable (the list column is decoded)."""
    syn = make_store(["lance"], n_tokens=30_000)
    lance.dataset(str(syn.path / "train" / "lance")).drop_columns(["token_bytes"])  # metadata only: same files
    reader = open_store(syn.path).reader("train", "lance")
    starts = np.random.default_rng(3).integers(0, len(syn.stream) - 700, size=16)
    np.testing.assert_array_equal(reader.windows(starts, 700), syn.stream[starts[:, None] + np.arange(700)])
    assert reader._column == "tokens"
    np.testing.assert_array_equal(reader.document(3), syn.stream[syn.doc_starts[3]:syn.doc_starts[4]])
