"""inspect / sql / show / verify over the sample store, through the library and the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from ingest_common import FORMATS, HOLDOUT, REPO, SAMPLE

from lmdata.errors import LmdataError
from lmdata.inspect import format_inspect, format_rows, inspect, show, sql
from lmdata.sources import SourceSpec, iter_documents
from lmdata.store import open_store, verify_store


def _lmdata(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmdata", *args], cwd=REPO, capture_output=True, text=True)


def test_inspect_agrees_with_the_manifest(sample_store):
    report = inspect(sample_store)
    manifest = open_store(sample_store).manifest
    assert report["tokenizer"]["hash"] == manifest.tokenizer_hash
    for split, info in manifest.splits.items():
        entry = report["splits"][split]
        assert (entry["documents"], entry["tokens"]) == (info.n_docs, info.n_tokens)
        assert set(entry["formats"]) == set(FORMATS)
        assert entry["formats"]["memmap"]["bytes"] >= 2 * info.n_tokens
        d = entry["doc_tokens"]
        assert d["min"] <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"]
        assert 1.5 < entry["text_bytes_per_token"] < 4
    assert "train: 55 documents" in format_inspect(report)


def test_docs_table_is_the_same_from_every_format(sample_store):
    from lmdata.inspect import doc_table
    from lmdata.store.manifest import read_manifest

    expected = doc_table(sample_store, read_manifest(sample_store), "train")
    for keep in ("parquet", "lance"):
        manifest = read_manifest(sample_store)
        for fmt in FORMATS:
            if fmt != keep:
                del manifest.splits["train"].formats[fmt]
        assert doc_table(sample_store, manifest, "train").equals(expected), keep


def test_sql_answers_agree_with_the_manifest(sample_store):
    manifest = open_store(sample_store).manifest
    cols, rows = sql(sample_store, "SELECT split, count(*), sum(n_tokens), count(DISTINCT shard) FROM docs "
                                   "GROUP BY split ORDER BY split")
    assert cols[0] == "split"
    for split, n_docs, n_tokens, n_shards in rows:
        info = manifest.splits[split]
        assert (n_docs, n_tokens, n_shards) == (info.n_docs, info.n_tokens, len(info.formats["memmap"]))
    for view in ("tokens", "tokens_parquet", "tokens_lance"):
        _, rows = sql(sample_store, f"SELECT split, count(DISTINCT doc_id), sum(len(tokens)) FROM {view} "
                                    "GROUP BY split ORDER BY split")
        assert rows == [(s, i.n_docs, i.n_tokens) for s, i in sorted(manifest.splits.items())], view


@pytest.mark.parametrize("view", ["tokens_parquet", "tokens_lance"])
def test_where_filters_work_on_every_tokens_view(sample_store, view):
    store = open_store(sample_store)
    _, rows = sql(sample_store, f"SELECT doc_id, tokens FROM {view} WHERE split = 'validation' AND doc_id = 2 "
                                "ORDER BY token_offset")
    ids = [t for _, toks in rows for t in toks]
    assert ids == store.document("validation", 2).tolist()
    _, rows = sql(sample_store, f"SELECT count(*) FROM {view} a JOIN {view} b USING (split, doc_id, token_offset) "
                                "WHERE a.doc_id < 3")  # two scans of the same view in one query
    assert rows[0][0] > 0
    _, offsets = sql(sample_store, f"SELECT min(token_offset) FROM {view} WHERE split='train' AND doc_id=7")
    _, docs = sql(sample_store, "SELECT token_offset FROM docs WHERE split='train' AND doc_id=7")
    assert offsets == docs


def test_sql_cannot_touch_files(sample_store, tmp_path):
    for query in (f"SELECT * FROM read_csv('{SAMPLE}')",
                  f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'",
                  f"COPY (SELECT 1) TO '{sample_store / 'train' / 'memmap' / 'tokens-00000.bin'}'",
                  f"ATTACH '{tmp_path / 'x.db'}'",
                  "SET enable_external_access = true",
                  "INSTALL lance"):
        with pytest.raises(LmdataError, match="^sql: "):
            sql(sample_store, query)
    assert not list(tmp_path.iterdir())
    assert verify_store(sample_store).ok


def test_output_formats():
    cols, rows = ["a", "b"], [(1, "x,y"), (2, None)]
    assert format_rows(cols, rows, "csv") == 'a,b\n1,"x,y"\n2,'
    assert json.loads(format_rows(cols, rows, "json")) == [{"a": 1, "b": "x,y"}, {"a": 2, "b": None}]
    assert format_rows(cols, rows, "table").splitlines()[2] == "1  x,y"


def test_show_decodes_documents(sample_store):
    docs = [d.text for d in iter_documents(SourceSpec((str(SAMPLE),)))]
    assert show(sample_store, "validation", HOLDOUT - 1) == docs[-1]
    for fmt in FORMATS:
        assert show(sample_store, "train", 3, fmt) == docs[3]
    with pytest.raises(LmdataError, match="--doc 55: split 'train' has documents 0..54"):
        show(sample_store, "train", 55)


def test_cli_commands(sample_store, tokenizer_dir, tmp_path):
    r = _lmdata("inspect", str(sample_store), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["splits"]["validation"]["documents"] == HOLDOUT
    r = _lmdata("sql", str(sample_store), "SELECT split, count(*) AS n FROM docs GROUP BY split ORDER BY split",
                "--format", "csv")
    assert r.stdout.splitlines() == ["split,n", "train,55", f"validation,{HOLDOUT}"]
    r = _lmdata("sql", str(sample_store), "SELECT nope FROM docs")
    assert r.returncode == 1 and r.stderr.startswith("error: sql:") and "Traceback" not in r.stderr
    r = _lmdata("show", str(sample_store), "--split", "train", "--doc", "0")
    assert r.stdout.startswith("Fellow-Citizens of the Senate")
    assert _lmdata("verify", str(sample_store)).returncode == 0
    # the shipped pipeline, with the tokenizer and output overridden by flags
    out = tmp_path / "from-pipeline"
    r = _lmdata("ingest", "pipelines/sample.toml", "--tokenizer", str(tokenizer_dir), "--out", str(out),
                "--format", "memmap", "--workers", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "validation: 6 documents" in r.stdout
    r = _lmdata("ingest", "--input", str(SAMPLE), "--tokenizer", str(tokenizer_dir), "--out", str(out),
                "--format", "memmap,zarr")
    assert r.returncode == 1 and "unknown format 'zarr'" in r.stderr


def _damaged_copy(sample_store, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(sample_store, store)
    return store


def test_truncated_shard_is_found_and_refused(sample_store, tmp_path):
    store = _damaged_copy(sample_store, tmp_path)
    for fmt, name in [("memmap", "tokens-00002.bin"), ("parquet", "shard-00002.parquet")]:
        path = store / "train" / fmt / name
        path.write_bytes(path.read_bytes()[:-10])
    report = verify_store(store)
    assert not report.ok and "shard 00002" in report.problems[0]
    with pytest.raises(LmdataError, match="shard 00002"):
        open_store(store)
    r = _lmdata("verify", str(store))
    assert r.returncode == 1 and "shard 00002" in r.stderr


def test_bit_flipped_shard_is_found(sample_store, tmp_path):
    store = _damaged_copy(sample_store, tmp_path)
    path = store / "validation" / "memmap" / "tokens-00001.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    report = verify_store(store)
    assert not report.ok and "shard 00001" in report.problems[0] and "sha256" in report.problems[0]
    r = _lmdata("verify", str(store))
    assert r.returncode == 1 and "shard 00001" in r.stderr
