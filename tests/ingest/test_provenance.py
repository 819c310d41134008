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


def test_docs_view_and_show_name_the_source(tmp_path: Path, tokenizer_dir: Path, capsys) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from samples import run_cli

    from lmdata.inspect import sql

    a, b = tmp_path / "a.txt", tmp_path / "b.parquet"
    a.write_bytes(b"one\n<|endoftext|>\ntwo two\n")
    pq.write_table(pa.table({"text": ["three", "four", "five"]}), b)
    out = tmp_path / "store"
    ingest({"train": SourceSpec((str(a), str(b)))}, tokenizer_dir, out, progress=False, log=None)
    cols, rows = sql(out, "SELECT doc_id, source, source_offset FROM docs ORDER BY doc_id")
    assert rows == [(0, str(a), 0), (1, str(a), 18), (2, str(b), 0), (3, str(b), 1), (4, str(b), 2)]
    code, text, err = run_cli(["show", str(out), "--doc", "3"], capsys)
    assert code == 0 and text == "four\n" and err == f"doc 3 of train: {b}, row 1\n"
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["splits"]["train"]["provenance"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert sql(out, "SELECT count(*) FROM docs WHERE source IS NULL AND source_offset IS NULL")[1] == [(5,)]
    code, text, err = run_cli(["show", str(out), "--doc", "1"], capsys)
    assert code == 0 and text == "two two\n" and "source (unknown: the store was ingested before" in err


def test_a_provenance_file_linked_out_of_the_store_is_refused_where_it_is_read(tmp_path: Path,
                                                                                tokenizer_dir: Path) -> None:
    """Each provenance file is opened without following a symlink (no ``lstat`` of every file of the
    table first: a 100,000-shard store's ``lmdata show`` had spent 1.6 s on them); a link inside the
    store is followed, one out of it refused naming it."""
    a = tmp_path / "a.txt"
    a.write_bytes(b"one\n<|endoftext|>\ntwo two\n<|endoftext|>\nthree\n")
    out = tmp_path / "store"
    ingest({"train": SourceSpec((str(a),))}, tokenizer_dir, out, shard_tokens=4, workers=1, progress=False, log=None)
    prov = out / "train" / "_provenance"
    victim = sorted(prov.glob("origins-*.npy"))[1]
    inside, outside = out / "train" / f"moved-{victim.name}", tmp_path / f"outside-{victim.name}"
    victim.rename(inside)
    victim.symlink_to(inside)
    assert [origins(open_store(out), "train").of(d) for d in range(3)] == [(str(a), 0), (str(a), 18), (str(a), 40)]
    inside.rename(outside)
    victim.unlink()
    victim.symlink_to(outside)
    where = origins(open_store(out), "train")
    assert where.of(0) == (str(a), 0)  # the other files read
    with pytest.raises(LmdataError, match="outside the store"):
        [where.of(d) for d in range(3)]


def test_a_provenance_shard_without_its_file_is_one_line(tmp_path: Path, tokenizer_dir: Path) -> None:
    a = tmp_path / "a.txt"
    a.write_bytes(b"one\n<|endoftext|>\ntwo two\n")
    out = tmp_path / "store"
    ingest({"train": SourceSpec((str(a),))}, tokenizer_dir, out, shard_tokens=4, workers=1, progress=False, log=None)
    m = json.loads((out / "manifest.json").read_text())
    m["splits"]["train"]["provenance"]["shards"][0]["files"] = []
    (out / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(LmdataError, match="records 0 files, expected 1"):
        origins(open_store(out), "train").of(0)
