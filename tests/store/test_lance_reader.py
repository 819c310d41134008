"""The Lance reader: one ``take`` per batch over a few large fragments, windows across fragments."""

from __future__ import annotations

import lance
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
