"""Lance specifics: uncommitted fragments survive an interruption; leftovers are removed."""

from __future__ import annotations

import numpy as np

from lmdata.store import open_store
from lmdata.store.registry import get_format


def test_unreferenced_fragment_files_are_removed(make_store):
    syn = make_store(["lance"])
    data = syn.path / "train" / "lance" / "data"
    before = sorted(p.name for p in data.iterdir())
    orphan = data / "0000deadbeef.lance"  # what an interrupted shard or commit leaves behind
    orphan.write_bytes(b"x" * 100)
    get_format("lance").writer(syn.path / "train" / "lance", np.dtype(np.uint16)).cleanup_partial()
    assert sorted(p.name for p in data.iterdir()) == before
    r = open_store(syn.path).reader("train", "lance")
    np.testing.assert_array_equal(r.windows(np.array([len(syn.stream) - 50]), 50)[0], syn.stream[-50:])


def test_resumed_writer_commits_reused_and_rewritten_fragments(tmp_path):
    """Shards 0-1 written by an "interrupted" writer, shard 1 rewritten, then one commit."""
    fdir = tmp_path / "train" / "lance"
    rng = np.random.default_rng(0)
    shards_tokens = [rng.integers(0, 100, size=n).astype(np.uint16) for n in (3000, 2500, 4000)]
    first = get_format("lance").writer(fdir, np.dtype(np.uint16))
    infos = []
    for i, tok in enumerate(shards_tokens[:2]):
        infos.append(first.write_shard(i, tok, np.array([0, len(tok)]), i, sum(map(len, shards_tokens[:i]))))
    # "crash": no finish. A new writer resumes: shard 0 reused, shard 1 rewritten, shard 2 new.
    second = get_format("lance").writer(fdir, np.dtype(np.uint16))
    done = second.completed()
    assert sorted(done) == [0, 1]
    second.cleanup_partial()
    shards = [done[0]]
    for i in (1, 2):
        tok = shards_tokens[i]
        shards.append(second.write_shard(i, tok, np.array([0, len(tok)]), i, sum(map(len, shards_tokens[:i]))))
    second.finish(shards)
    assert len(list((fdir / "data").iterdir())) == 3  # shard 1's first fragment is gone
    reader = get_format("lance").reader(fdir, shards, np.dtype(np.uint16))
    stream = np.concatenate(shards_tokens)
    np.testing.assert_array_equal(reader.windows(np.array([0, 2990, 5400]), 1000),
                                  stream[np.array([0, 2990, 5400])[:, None] + np.arange(1000)])
