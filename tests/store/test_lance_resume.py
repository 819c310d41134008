"""Lance resume: staging fragments survive an interruption, fragments are reused or rebuilt, leftovers go."""

from __future__ import annotations

import lance
import numpy as np
import pytest

from lmdata.errors import LmdataError
from lmdata.store import open_store
from lmdata.store.formats import lance_fragments
from lmdata.store.registry import get_format

U16 = np.dtype(np.uint16)
SIZES = (3000, 2500, 4000, 3500, 2000)  # with a 6,000-token limit: fragments [0, 1], [2], [3, 4]


@pytest.fixture
def parts():
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 100, size=n).astype(np.uint16) for n in SIZES]
    return tokens, np.concatenate(tokens)


def writer(fdir):
    return get_format("lance").writer(fdir, U16, fragment_tokens=6_000)


def write(w, tokens, indices):
    first = np.cumsum([0, *map(len, tokens)])
    return [w.write_shard(i, tokens[i], np.array([0, 1000, len(tokens[i])]), 2 * i, int(first[i])) for i in indices]


def check(fdir, fragments, stream):
    reader = get_format("lance").reader(fdir, fragments, U16)
    starts = np.arange(0, len(stream) - 1000, 333)
    np.testing.assert_array_equal(reader.windows(starts, 1000), stream[starts[:, None] + np.arange(1000)])
    assert len(lance.dataset(str(fdir)).get_fragments()) == len(fragments)
    assert len(list((fdir / "data").iterdir())) == len(fragments)  # staging and old fragments are gone


def test_unreferenced_fragment_files_are_removed(make_store):
    syn = make_store(["lance"])
    data = syn.path / "train" / "lance" / "data"
    before = sorted(p.name for p in data.iterdir())
    orphan = data / "0000deadbeef.lance"  # what an interrupted shard or commit leaves behind
    orphan.write_bytes(b"x" * 100)
    get_format("lance").writer(syn.path / "train" / "lance", U16).cleanup_partial()
    assert sorted(p.name for p in data.iterdir()) == before
    r = open_store(syn.path).reader("train", "lance")
    np.testing.assert_array_equal(r.windows(np.array([len(syn.stream) - 50]), 50)[0], syn.stream[-50:])


def test_resumed_writer_groups_reused_and_rewritten_shards(tmp_path, parts):
    """Shards 0-1 written by an "interrupted" writer, shard 1 rewritten, then the rest and one commit."""
    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    write(writer(fdir), tokens, [0, 1])
    second = writer(fdir)  # "crash": no finish; a new writer resumes
    done = second.completed()
    assert sorted(done) == [0, 1]
    second.cleanup_partial()
    fragments = second.finish([done[0], *write(second, tokens, [1, 2, 3, 4])])
    assert [f.name for f in fragments] == ["00000-00001", "00002", "00003-00004"]
    check(fdir, fragments, stream)


def test_a_finished_split_is_reused_as_is(tmp_path, parts):
    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    w = writer(fdir)
    fragments = w.finish(write(w, tokens, range(5)))
    files_before = sorted(p.name for p in (fdir / "data").iterdir())
    again = writer(fdir)  # ``--resume`` of a finished store: every shard is reported, nothing is rewritten
    done = again.completed()
    assert sorted(done) == [0, 1, 2, 3, 4]
    again.cleanup_partial()
    assert [f.to_json() for f in again.finish(list(done.values()))] == [f.to_json() for f in fragments]
    assert sorted(p.name for p in (fdir / "data").iterdir()) == files_before
    check(fdir, fragments, stream)


def test_a_crash_before_the_commit_resumes_from_fragment_records(tmp_path, parts, monkeypatch):
    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    w = writer(fdir)
    shards = write(w, tokens, range(5))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lance.LanceDataset, "commit", crash)
    with pytest.raises(KeyboardInterrupt):
        w.finish(shards)
    monkeypatch.undo()
    assert sorted(p.stem for p in (fdir / lance_fragments.GROUP_DIR).iterdir()) == ["00000-00001", "00003-00004"]
    again = writer(fdir)
    done = again.completed()
    assert [done[i].extra.get("fragment_of") for i in range(5)] == ["00000-00001"] * 2 + [None] + ["00003-00004"] * 2
    again.cleanup_partial()
    check(fdir, again.finish(list(done.values())), stream)


def test_a_rewritten_shard_rebuilds_its_fragment_from_the_old_one(tmp_path, parts):
    """A finished split whose shard 1 is redone (another format's copy was damaged): [0, 1] is rebuilt,
    shard 0's rows coming from the old fragment, whose staging files are long gone."""
    tokens, _ = parts
    fdir = tmp_path / "train" / "lance"
    w = writer(fdir)
    old = w.finish(write(w, tokens, range(5)))
    again = writer(fdir)
    done = again.completed()
    tokens = [t.copy() for t in tokens]
    tokens[1][:10] = 99  # the redone shard's tokens (same counts)
    redone = write(again, tokens, [1])[0]
    fragments = again.finish([done[0], redone, done[2], done[3], done[4]])
    assert fragments[0].files[0].path != old[0].files[0].path and fragments[2].to_json() == old[2].to_json()
    check(fdir, fragments, np.concatenate(tokens))


def test_a_new_fragment_limit_regroups_a_finished_split(tmp_path, parts):
    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    w = writer(fdir)
    w.finish(write(w, tokens, range(5)))
    bigger = get_format("lance").writer(fdir, U16, fragment_tokens=100_000)
    fragments = bigger.finish(list(bigger.completed().values()))
    assert [f.name for f in fragments] == ["00000-00004"]
    check(fdir, fragments, stream)


def test_a_smaller_fragment_limit_splits_an_earlier_larger_fragment(tmp_path, parts):
    """A split written under a larger limit (an lmdata before fragments of 32 Mi tokens) resumes
    into the smaller one: each fragment rebuilt from the rows inside the old one, which goes."""
    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    bigger = get_format("lance").writer(fdir, U16, fragment_tokens=100_000)
    assert len(bigger.finish(write(bigger, tokens, range(5)))) == 1
    w = writer(fdir)
    fragments = w.finish(list(w.completed().values()))
    assert [f.name for f in fragments] == ["00000-00001", "00002", "00003-00004"]
    check(fdir, fragments, stream)


def test_cleanup_after_rewrites_keeps_the_rewritten_staging_files(tmp_path, parts):
    """The Ray engine cleans up after its writes: a shard redone in this run (a staging record)
    that an older fragment record still holds must keep its new files."""
    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    w = writer(fdir)
    w.finish(write(w, tokens, range(5)))
    again = writer(fdir)
    done = again.completed()
    redone = write(again, tokens, [1])[0]
    again.cleanup_partial()
    assert all((fdir / f.path).exists() for f in redone.files)
    check(fdir, again.finish([done[0], redone, done[2], done[3], done[4]]), stream)


def test_a_store_committed_after_its_manifest_is_refused(tmp_path, parts, monkeypatch):
    """A re-ingest that committed other fragments and was killed before its cleanup and manifest:
    the old manifest's files are all still there, but the dataset is no longer theirs."""
    tokens, _ = parts
    fdir = tmp_path / "train" / "lance"
    w = writer(fdir)
    fragments = w.finish(write(w, tokens, range(5)))
    bigger = get_format("lance").writer(fdir, U16, fragment_tokens=100_000)
    monkeypatch.setattr(lance_fragments, "remove_unused", lambda *a: None)  # killed right after the commit
    bigger.finish(list(bigger.completed().values()))
    reader = get_format("lance").reader(fdir, fragments, U16)
    with pytest.raises(LmdataError, match="not the manifest's"):
        reader.windows(np.array([0]), 10)


def test_a_damaged_staging_fragment_is_named_when_grouping(tmp_path, parts):
    tokens, _ = parts
    fdir = tmp_path / "train" / "lance"
    w = writer(fdir)
    shards = write(w, tokens, range(5))
    victim = fdir / shards[3].files[0].path
    victim.write_bytes(b"\0" * victim.stat().st_size)  # same size: only reading it finds out
    with pytest.raises(LmdataError, match="shard 00003"):
        w.finish(shards)


def test_staging_of_an_earlier_layout_is_written_again(tmp_path, parts, monkeypatch, earlier_lance_layout):
    """An ingest interrupted under an earlier lmdata (rows with ``token_bytes``, records marked so)
    resumes into this layout: every fragment of the commit has the same columns."""
    import json

    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    with monkeypatch.context() as m:
        earlier_lance_layout(patch=m)
        write(writer(fdir), tokens, range(3))
    records = [json.loads(p.read_text())["extra"] for p in (fdir / "_shards").glob("*.json")]
    assert len(records) == 3 and all(r.get("token_bytes") and "columns" not in r for r in records)
    again = writer(fdir)
    assert again.completed() == {}  # nothing of the old layout is reused
    again.cleanup_partial()
    shards = write(again, tokens, range(5))
    check(fdir, again.finish(shards), stream)
    assert lance.dataset(str(fdir)).schema.names == ["doc_id", "token_offset", "tokens"]


def in_order_writer(fdir):
    w = writer(fdir)
    w.write_in_order()  # what the local engine does: shards stream into their fragments
    return w


def test_shards_written_in_order_go_straight_into_their_fragments(tmp_path, parts, monkeypatch):
    """Streamed: the fragments ``finish`` plans are already written and recorded, so it rewrites
    nothing, and the split reads the same as through staging fragments."""
    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    w = in_order_writer(fdir)
    shards = write(w, tokens, range(5))
    assert [p.name for p in (fdir / "_shards").iterdir()] == ["00002.json"]  # a lone shard: as if staged

    def no_rewrite(*args, **kwargs):
        raise AssertionError("a streamed fragment was rewritten")

    monkeypatch.setattr(lance_fragments, "write_fragment", no_rewrite)
    fragments = w.finish(shards)
    assert [f.name for f in fragments] == ["00000-00001", "00002", "00003-00004"]
    assert [[m["name"] for m in f.extra.get("members", [f.to_json()])] for f in fragments] == [
        ["00000", "00001"], ["00002"], ["00003", "00004"]]
    check(fdir, fragments, stream)
    monkeypatch.undo()
    staged_dir = tmp_path / "staged" / "lance"  # the same shards through staging: the same rows, the same row index
    staged = writer(staged_dir).finish(write(writer(staged_dir), tokens, range(5)))
    for a, b in zip(fragments, staged):  # (a lone staged shard keeps its staging rows-NNNNN.npy name)
        assert np.array_equal(np.load(fdir / a.files[1].path), np.load(staged_dir / b.files[1].path))


def test_a_crash_inside_a_streamed_fragment_redoes_only_its_shards(tmp_path, parts):
    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    w = in_order_writer(fdir)
    write(w, tokens, range(4))  # fragments [0, 1] and [2] closed, [3, ...] open
    w.abandon()  # "killed": the open fragment never closes
    again = in_order_writer(fdir)
    done = again.completed()
    assert sorted(done) == [0, 1, 2]
    again.cleanup_partial()
    assert len(list((fdir / "data").iterdir())) == 2  # the unfinished fragment's file is gone
    fragments = again.finish([done[0], done[1], done[2], *write(again, tokens, [3, 4])])
    assert [f.name for f in fragments] == ["00000-00001", "00002", "00003-00004"]
    check(fdir, fragments, stream)


def test_a_failing_fragment_writer_surfaces_its_error(tmp_path, parts, monkeypatch):
    from lance.fragment import LanceFragment

    tokens, _ = parts

    def broken(*args, **kwargs):
        raise OSError("simulated device error")

    monkeypatch.setattr(LanceFragment, "create", broken)
    w = in_order_writer(tmp_path / "train" / "lance")
    with pytest.raises(OSError, match="simulated device error"):
        w.finish(write(w, tokens, range(5)))


def test_shards_of_another_lance_file_version_are_written_again(tmp_path, parts, monkeypatch):
    """An ingest interrupted under an lmdata that wrote Lance file format 2.1 resumes into this one's
    (``STORAGE_VERSION``): Lance refuses a commit of data files of two versions."""
    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    with monkeypatch.context() as m:
        m.setattr(lance_fragments, "STORAGE_VERSION", "2.1")
        first = writer(fdir)
        assert len(first.completed()) == 0
        write(first, tokens, range(3))
        assert len(writer(fdir).completed()) == 3  # its own version: reused
    again = writer(fdir)
    assert again.completed() == {}  # another version: nothing reused
    again.cleanup_partial()
    shards = write(again, tokens, range(5))
    check(fdir, again.finish(shards), stream)
    versions = {(f.file_major_version, f.file_minor_version) for frag in lance.dataset(str(fdir)).get_fragments()
                for f in frag.data_files()}
    assert versions == {tuple(int(v) for v in lance_fragments.STORAGE_VERSION.split("."))}
