"""Issue 27.2 (each document's source in the store) and 29.7 (an input changed while it is read)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmdata.errors import LmdataError
from lmdata.ingest.job import ingest
from lmdata.sources import SourceSpec, iter_documents
from lmdata.store import open_store
from lmdata.store.provenance import origins


def test_origins_name_each_documents_file_and_offset(tmp_path: Path, tokenizer_dir: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.jsonl"
    a.write_bytes(b"one\n<|endoftext|>\ntwo two\n<|endoftext|>\nthree\n")
    b.write_bytes(b'{"text": "four"}\n\n{"text": "five"}\n')
    out = tmp_path / "store"
    ingest({"train": SourceSpec((str(a), str(b)))}, tokenizer_dir, out, shard_tokens=8, workers=2,
           progress=False, log=None)
    store = open_store(out)
    got = [origins(store, "train").of(d) for d in range(5)]
    assert got == [(str(a), 0), (str(a), 18), (str(a), 40), (str(b), 0), (str(b), 18)]
    assert json.loads((out / "manifest.json").read_text())["splits"]["train"]["provenance"]["shards"]


def test_store_without_the_record_says_unknown(tmp_path: Path, tokenizer_dir: Path) -> None:
    a = tmp_path / "a.txt"
    a.write_bytes(b"one\n<|endoftext|>\ntwo\n")
    out = tmp_path / "store"
    ingest({"train": SourceSpec((str(a),))}, tokenizer_dir, out, progress=False, log=None)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["splits"]["train"]["provenance"]  # as a store written before the record
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert origins(open_store(out), "train").of(0) is None


def test_file_truncated_while_read_is_an_error(tmp_path: Path) -> None:
    a = tmp_path / "a.txt"
    a.write_bytes(b"".join(b"doc %d\n<|endoftext|>\n" % i for i in range(20_000)))
    docs = iter_documents(SourceSpec((str(a),)))
    next(docs)
    with open(a, "r+b") as fh:  # a real truncation, mid-read
        fh.truncate(1000)
    with pytest.raises(LmdataError, match="changed while it was ingested"):
        list(docs)


def test_file_cut_after_hashing_is_refused_against_the_manifest(tmp_path: Path) -> None:
    a = tmp_path / "a.txt"
    a.write_bytes(b"x\n<|endoftext|>\ny\n")
    spec = SourceSpec((str(a),), expect=((str(a), a.stat().st_size + 5),))
    with pytest.raises(LmdataError, match="bytes when hashed for the manifest"):
        list(iter_documents(spec))
