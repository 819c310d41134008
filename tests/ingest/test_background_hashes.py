"""The inputs' sha256 for the ingest plan, taken on a thread while the ingest starts."""

from __future__ import annotations

import threading

from lmdata.ingest.output import BackgroundHashes
from lmdata.io.location import location
from lmdata.ingest.splits import SplitSource
from lmdata.sources import SourceSpec, describe


def test_the_records_are_describe_s_and_the_thread_never_holds_the_process(tmp_path):
    paths = []
    for i in range(3):
        p = tmp_path / f"in{i}.txt"
        p.write_text(f"document {i}\n" * (1000 * (i + 1)))
        paths.append(p)
    splits = {"train": SplitSource(SourceSpec(tuple(map(str, paths[:2])))),
              "extra": SplitSource(SourceSpec((str(paths[2]), str(paths[0]))))}  # a file in two splits: hashed once
    hashes = BackgroundHashes(splits)
    (thread,) = [t for t in threading.enumerate() if t.name == "lmdata-hash"] or [None]
    assert thread is None or thread.daemon  # a failed ingest's process never waits for it at exit
    files = [location(str(p)) for p in (paths[2], paths[0], paths[1])]
    assert hashes.describe_all(files) == [describe(f) for f in files]
    assert len(hashes.files) == 3


def test_a_stopped_hash_gives_up_between_blocks(tmp_path):
    p = tmp_path / "big.txt"
    p.write_bytes(b"x" * (3 << 20))
    stop = threading.Event()
    stop.set()
    assert describe(location(str(p)), stop) == {}


def test_an_input_named_like_the_error_slot_is_a_file_like_any_other(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "error").write_text("a document\n")
    hashes = BackgroundHashes({"train": SplitSource(SourceSpec(("error",)))})
    (record,) = hashes.describe_all([location("error")])
    assert record == describe(location("error"))
