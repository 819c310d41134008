"""The streamed Lance writer (``lance_stream``) where it meets resume, the Ray engine's staging and failures."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from lmdata.store.formats import lance_fragments
from lmdata.store.registry import get_format

from test_lance_resume import SIZES, U16, check, in_order_writer, parts, write, writer  # noqa: F401


def test_local_resume_of_a_ray_run_with_a_gap_in_its_staged_shards(tmp_path, parts):
    """Ray (staging, out of order) finished shards 0 and 2, then died; the local engine resumes.
    The cutter reuses 0 and 2 (``have``) and streams 1, 3, 4: the stream holds [1, 3], a fragment
    whose members skip shard 2, so ``members`` gives shard 3 the wrong first token/document."""
    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    write(writer(fdir), tokens, [0, 2])  # Ray's tasks: staged shards 0 and 2
    w = in_order_writer(fdir)
    done = w.completed()
    w.cleanup_partial()
    assert sorted(done) == [0, 2]
    s1, s3, s4 = write(w, tokens, [1, 3, 4])  # what ShardCutter hands the writer (0 and 2 are reused)
    fragments = w.finish([done[0], s1, done[2], s3, s4])
    check(fdir, fragments, stream)


def test_stream_and_staging_write_the_same_bytes_for_large_shards(tmp_path):
    """Ray's engine stages, the local engine streams: with shards of a few Mi tokens (--shard-tokens
    4194304) the multi-shard fragment's data file differs (write_fragment feeds Lance 4,096-row
    batches, the stream one batch per shard), so test_ray's checksum fingerprint would differ."""
    rng = np.random.default_rng(0)
    sizes = [3_000_000, 2_500_000]
    tokens = [rng.integers(0, 50_000, size=n).astype(np.uint16) for n in sizes]
    starts = [np.append(np.arange(0, n, 300), n) for n in sizes]

    def run(fdir, in_order):
        w = get_format("lance").writer(fdir, U16, fragment_tokens=6_000_000)
        if in_order:
            w.write_in_order()
        shards = [w.write_shard(0, tokens[0], starts[0], 0, 0),
                  w.write_shard(1, tokens[1], starts[1], len(starts[0]) - 1, sizes[0])]
        return w.finish(shards)

    local, ray = run(tmp_path / "local", True), run(tmp_path / "ray", False)
    assert [[(f.bytes, f.digest) for f in s.files] for s in local] == [[(f.bytes, f.digest) for f in s.files] for s in ray]


def test_a_failing_finish_of_another_format_leaves_no_lance_thread(tokenizer_dir, tmp_path, monkeypatch):
    """LocalEngine.ingest_split calls each format's finish in turn, after its ``finally`` (which
    abandons streams only when ``written`` is False); when an earlier finish raises (memmap's:
    a full disk, a Ctrl-C), Lance's open stream is neither closed nor abandoned: its thread
    waits on the queue for good, holding the fragment's file (and, in a notebook, its memory)."""
    from samples import SAMPLE

    from lmdata.errors import LmdataError
    from lmdata.ingest import ingest
    from lmdata.sources import SourceSpec
    from lmdata.store.formats.memmap import MemmapWriter

    def failing_finish(self, shards):
        raise LmdataError("simulated: memmap finish failed")

    monkeypatch.setattr(MemmapWriter, "finish", failing_finish)
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(LmdataError, match="simulated"):
        ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, tmp_path / "store",
               formats=["memmap", "lance"], workers=1, progress=False, log=None)
    left = [t for t in threading.enumerate() if t.name == "lmdata-lance-fragment" and t.ident not in before]
    assert not left, left


def test_a_full_disk_met_between_the_checks_in_add_is_still_a_no_space_error(tmp_path, parts, monkeypatch):
    """``FragmentStream.add`` checks the thread's error, then whether it is alive: a Lance thread
    that fails between the two (here: the writer thread is descheduled right after the first check)
    surfaces as "stopped early", a plain LmdataError, so job.py deletes a fresh store instead of
    keeping it for --resume, and the disk-full message is lost."""
    import errno
    import time

    from lance.fragment import LanceFragment

    from lmdata.io.atomic import NoSpaceError
    from lmdata.store.formats.lance_stream import FragmentStream

    tokens, _ = parts
    real_check = FragmentStream._raise_failure

    def create(uri, reader, **kwargs):
        next(iter(reader))  # the first shard's rows arrive, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    def descheduled(self):
        real_check(self)
        time.sleep(0.3)

    monkeypatch.setattr(LanceFragment, "create", create)
    monkeypatch.setattr(FragmentStream, "_raise_failure", descheduled)
    w = in_order_writer(tmp_path / "train" / "lance")
    with pytest.raises(NoSpaceError):
        write(w, tokens, [0])
    w.abandon()


def test_the_checksum_taken_while_lance_writes_is_the_file_s(tmp_path, parts, monkeypatch):
    """The data file is hashed (and flushed) as Lance appends to it, in pieces: the recorded checksum
    and size are those of the finished file."""
    from lmdata.io import digests

    from lmdata.store.formats import lance_stream

    monkeypatch.setattr(lance_stream, "SYNC_BYTES", 1)  # flush at every step too
    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    w = in_order_writer(fdir)
    fragments = w.finish(write(w, tokens, range(5)))
    for fragment in fragments:
        data = fragment.files[0]
        raw = (fdir / data.path).read_bytes()
        assert (data.bytes, data.digest) == (len(raw), digests.of(raw))
    check(fdir, fragments, stream)


def test_the_follower_hashes_a_file_that_grows_and_is_renamed(tmp_path, monkeypatch):
    """What Lance does with a fragment's data file: appends to ``data/.tmpXXXX``, renames it when done."""
    import os

    from lmdata.io import digests
    from lmdata.store.formats import lance_stream

    monkeypatch.setattr(lance_stream, "SYNC_BYTES", 1000)
    data = tmp_path / "data"
    data.mkdir()
    (data / "older.lance").write_bytes(b"another fragment's file")
    follower = lance_stream._Follower(data)
    follower.step()  # nothing new yet
    rng = np.random.default_rng(1)
    chunks = [rng.bytes(int(n)) for n in rng.integers(1, 5000, size=20)]
    with open(data / ".tmpABC", "wb") as fh:
        for chunk in chunks:
            fh.write(chunk)
            fh.flush()
            follower.step()
    os.rename(data / ".tmpABC", data / "final.lance")
    info = follower.info(tmp_path, "data/final.lance")
    whole = b"".join(chunks)
    assert (info.path, info.bytes, info.digest) == ("data/final.lance", len(whole), digests.of(whole))
    other = lance_stream._Follower(data)
    assert other.info(tmp_path, "data/final.lance") is None  # never saw the file grow: read it whole instead


def test_every_follower_is_closed(tmp_path, parts, monkeypatch):
    """Each fragment's follower closes the descriptor it reads the data file by: a fragment of one shard
    (recorded as a staged one, hashed whole) had left it open, one per fragment, for the process's life
    (whether it had opened one yet depends on how soon Lance created the file: counted by closes)."""
    from lmdata.store.formats import lance_stream

    made, closed = [], []
    real_init, real_close = lance_stream._Follower.__init__, lance_stream._Follower.close
    monkeypatch.setattr(lance_stream._Follower, "__init__", lambda self, d: (made.append(self), real_init(self, d))[1])
    monkeypatch.setattr(lance_stream._Follower, "close", lambda self: (closed.append(self), real_close(self))[1])
    tokens, stream = parts
    fdir = tmp_path / "train" / "lance"
    w = get_format("lance").writer(fdir, U16, fragment_tokens=1)  # every shard a fragment of its own
    w.write_in_order()  # streamed, as the local engine writes
    fragments = w.finish(write(w, tokens, range(5)))
    assert len(made) == 5 and all(f in closed for f in made) and all(f.fd is None for f in made)
    check(fdir, fragments, stream)
