"""The inputs' checksums for the ingest plan, taken on a thread while the ingest starts."""

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


def _text(tmp_path, n=4000):
    path = tmp_path / "in.txt"
    path.write_text("".join(f"document {i} says something about the weather, line {i % 7}\n\n" for i in range(n)))
    return path


def test_a_fresh_ingest_writes_shards_while_its_input_is_hashed(tmp_path, tokenizer_dir, monkeypatch):
    """The plan is written pending (checksum null) before any shard, the shards are written without waiting
    for the hash, and the plan and the manifest end with the input's checksum."""
    from lmdata.io import digests
    import json
    import time

    import lmdata.ingest.output as output
    from lmdata.ingest import ingest

    text, out, seen = _text(tmp_path), tmp_path / "store", {}
    real = output.describe

    def slow(path, stop=None):  # the hash waits (up to 20 s) for a shard's completion record
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not list(out.glob("train/memmap/_shards/*.json")):
            time.sleep(0.01)
        seen["shard_first"] = bool(list(out.glob("train/memmap/_shards/*.json")))
        seen["plan"] = json.loads((out / "ingest-plan.json").read_text())["splits"]["train"]["sources"]
        return real(path, stop)

    monkeypatch.setattr(output, "describe", slow)
    ingest({"train": SourceSpec((str(text),))}, tokenizer_dir, out, formats=["memmap"], shard_tokens=2000,
           workers=2, progress=False, log=None)
    sha = digests.of(text.read_bytes())
    assert seen["shard_first"] and seen["plan"] == [{"path": str(text), "bytes": text.stat().st_size, "xxh128": None}]
    for doc in ("ingest-plan.json", "manifest.json"):
        assert json.loads((out / doc).read_text())["splits"]["train"]["sources"][0]["xxh128"] == sha


def test_a_store_interrupted_before_its_inputs_were_hashed_is_not_resumed(tmp_path, tokenizer_dir):
    import json

    import pytest

    from lmdata.errors import LmdataError
    from lmdata.ingest import ingest

    text, out = _text(tmp_path, 800), tmp_path / "store"
    args = ({"train": SourceSpec((str(text),))}, tokenizer_dir, out)
    ingest(*args, formats=["memmap"], shard_tokens=2000, workers=1, progress=False, log=None)
    (out / "manifest.json").unlink()  # interrupted: shards, a plan, no manifest
    plan = json.loads((out / "ingest-plan.json").read_text())
    plan["splits"]["train"]["sources"][0]["xxh128"] = None  # ...before its input was hashed
    (out / "ingest-plan.json").write_text(json.dumps(plan))
    with pytest.raises(LmdataError, match="interrupted before its inputs were hashed.*--overwrite"):
        ingest(*args, formats=["memmap"], shard_tokens=2000, workers=1, progress=False, log=None, resume=True)
    res = ingest(*args, formats=["memmap"], shard_tokens=2000, workers=1, progress=False, log=None, overwrite=True)
    assert res.splits["train"].tokens > 0 and (out / "manifest.json").is_file()
