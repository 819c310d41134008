"""inspect / sql / show / verify over the sample store, through the library and the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from samples import FORMATS, HOLDOUT, REPO, SAMPLE

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
        memmap, lance = entry["formats"]["memmap"], entry["formats"]["lance"]
        assert lance["shards"] == memmap["shards"] == memmap["fragments"] == len(info.formats["memmap"])
        assert lance["fragments"] == len(info.formats["lance"]) <= lance["shards"]  # Lance groups shards
        assert entry["formats"]["memmap"]["bytes"] >= 2 * info.n_tokens
        d = entry["doc_tokens"]
        assert d["min"] <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"]
        assert 1.5 < entry["text_bytes_per_token"] < 4
    assert "train: 55 documents" in format_inspect(report)


def test_docs_table_is_the_same_from_every_format(sample_store):
    from lmdata.inspect import doc_table
    from lmdata.store.manifest import read_manifest
    from lmdata.store.store import Store

    expected = doc_table(open_store(sample_store), "train")
    assert expected.column("n_tokens").to_pylist() == [len(open_store(sample_store).document("train", d))
                                                       for d in range(expected.num_rows)]
    for keep in FORMATS:
        manifest = read_manifest(sample_store)
        for fmt in FORMATS:
            if fmt != keep:
                del manifest.splits["train"].formats[fmt]
        assert doc_table(Store(sample_store, manifest), "train").equals(expected), keep


def test_docs_batches_span_shards_and_read_the_same(sample_store, monkeypatch):
    """Batches gather documents from consecutive shards (one per shard had cost ~0.3 ms of Arrow calls a
    shard at 11,761 shards); the table is the same whatever the batch size, and so are inspect's lengths."""
    import pyarrow as pa

    from lmdata.inspect import tables

    store = open_store(sample_store)
    assert len(store.manifest.splits["train"].formats["memmap"]) > 3
    whole = tables.doc_table(store, "train")
    for docs in (1, 7, 1 << 16):
        monkeypatch.setattr(tables, "BATCH_DOCS", docs)
        batches = list(tables.doc_batches(store, "train"))
        assert pa.Table.from_batches(batches).equals(whole) and all(b.num_rows >= min(docs, 1) for b in batches)
    assert len(batches) == 1
    assert tables.doc_lengths(store, "train").tolist() == whole.column("n_tokens").to_pylist()


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


class LegacyReader:
    """A plug-in reader written before ``doc_starts``: only the protocol's first four members."""

    def __init__(self, format_dir, shards, dtype):
        from lmdata.store.formats.memmap import MemmapReader

        self._r = MemmapReader(format_dir, shards, dtype)
        self.n_tokens = self._r.n_tokens

    def check(self):
        self._r.check()

    def windows(self, starts, length):
        return self._r.windows(starts, length)

    def document(self, doc_id):
        return self._r.document(doc_id)


@pytest.mark.parametrize("legacy", [False, True], ids=["doc_starts", "legacy"])
def test_a_store_of_only_a_plugin_format(sample_store, tokenizer_dir, tmp_path, legacy):
    """inspect and the docs view ask the readers, never a format name; no rows, no tokens view."""
    from lmdata.ingest import ingest
    from lmdata.store.formats.memmap import MemmapReader, MemmapWriter
    from lmdata.store.registry import register_format, unregister_format
    from samples import SAMPLE_SHARD_TOKENS

    register_format("toy", MemmapWriter, LegacyReader if legacy else type("ToyReader", (MemmapReader,), {}))
    try:
        out = tmp_path / "toy"
        ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, out, formats=["toy"],
               shard_tokens=SAMPLE_SHARD_TOKENS, workers=1, holdout=("train", "validation", HOLDOUT),
               progress=False, log=None)
        assert verify_store(out).ok  # a reader without the built-ins' options (verify, use_cache) verifies too
        report = inspect(out)
        want = inspect(sample_store)
        for split, entry in report["splits"].items():
            assert list(entry["formats"]) == ["toy"]
            assert entry["doc_tokens"] == want["splits"][split]["doc_tokens"]
        query = "SELECT * FROM docs ORDER BY split, doc_id"
        assert sql(out, query) == sql(sample_store, query)
        with pytest.raises(LmdataError, match="^sql: .*tokens"):
            sql(out, "SELECT count(*) FROM tokens")
    finally:
        unregister_format("toy")


def test_one_statement_only(sample_store, tmp_path):
    for query in ("SELECT 1; SELECT 2", "CREATE TABLE t AS SELECT 1; SELECT * FROM t", ";", "  "):
        with pytest.raises(LmdataError, match=r"^sql: the query holds \d statements; give exactly one$"):
            sql(sample_store, query)
    assert sql(sample_store, "SELECT ';' AS s;") == (["s"], [(";",)])  # DuckDB's parser, not a split on ';'


def test_a_wrong_query_is_told_what_there_is_to_query(sample_store, tmp_path):
    docs = "docs(split, doc_id, shard, n_tokens, token_offset, source, source_offset)"
    rows = "(split, doc_id, token_offset, tokens)"
    for query, said, views in (("SELEC 1", 'Parser Error: syntax error at or near "SELEC"',
                                f"{docs} and, where the store has Parquet or Lance, tokens{rows}"),
                               ("SELECT nope FROM docs", "Binder Error: ",
                                f"{docs}, tokens{rows}, tokens_lance{rows}, tokens_parquet{rows}"),
                               ("SELECT * FROM nope", "Catalog Error: ",
                                f"{docs}, tokens{rows}, tokens_lance{rows}, tokens_parquet{rows}")):
        with pytest.raises(LmdataError) as e:
            sql(sample_store, query)
        assert str(e.value).startswith(f"sql: {said}") and str(e.value).endswith(
            f"; fix the query: the views are {views}"), e.value
    from lmdata.store.manifest import read_manifest, write_manifest

    only_memmap = tmp_path / "memmap-only"  # no row format: the hint had named a tokens view it lacks
    shutil.copytree(sample_store, only_memmap)
    manifest = read_manifest(only_memmap)
    for info in manifest.splits.values():
        del info.formats["parquet"], info.formats["lance"]
    write_manifest(only_memmap, manifest)
    with pytest.raises(LmdataError, match=r"Catalog Error: .*; fix the query: the views are docs\(split, doc_id, "
                                          r"shard, n_tokens, token_offset, source, source_offset\)$"):
        sql(only_memmap, "SELECT count(*) FROM tokens")


def test_views_are_lazy(sample_store, tmp_path):
    """connect() reads no rows: a damaged shard is met by the first query that scans it."""
    from lmdata.inspect import connect
    from lmdata.store.manifest import read_manifest, write_manifest

    store = _damaged_copy(sample_store, tmp_path)
    manifest = read_manifest(store)
    for info in manifest.splits.values():
        del info.formats["memmap"], info.formats["lance"]
    write_manifest(store, manifest)
    path = store / "train" / "parquet" / "shard-00003.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    connect(store).close()
    assert sql(store, "SELECT 42")[1] == [(42,)]
    # DuckDB scans every split's rows stream of the tokens view, and each shard is verified
    # before its rows are served (issue 19: as strict as the loader), so even this refuses
    with pytest.raises(LmdataError, match=f"^sql: {path}: shard 00003 fails its xxh128"):
        sql(store, "SELECT count(*) FROM tokens WHERE split = 'validation'")
    # the docs view reads only the doc_id/token_offset pages, whose CRC-32s pass (issue 15: a read is
    # checked on what it touches, as the loader's are): the index it serves is sound
    assert sql(store, "SELECT count(*) FROM docs")[1][0][0] > 0
    with pytest.raises(LmdataError, match=f"^sql: {path}: shard 00003 fails its xxh128"):  # its pages' CRCs,
        sql(store, "SELECT sum(len(tokens)) FROM tokens WHERE split = 'train'")  # named by a checksum pass


def test_output_is_capped_or_streamed(sample_store):
    import io

    from lmdata.inspect import TABLE_LIMIT, write_sql

    query = "SELECT split, doc_id FROM docs UNION ALL SELECT 'x', range FROM range(2000) ORDER BY 1, 2"
    n_rows = 2000 + 55 + HOLDOUT
    buf = io.StringIO()
    assert write_sql(sample_store, query, buf) == TABLE_LIMIT
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 + TABLE_LIMIT + 1 and lines[-1].startswith(f"(first {TABLE_LIMIT:,} rows shown")
    for fmt, extra in (("csv", 1), ("json", 0)):
        buf = io.StringIO()
        assert write_sql(sample_store, query, buf, fmt) == n_rows
        text = buf.getvalue()
        assert len(json.loads(text) if fmt == "json" else text.splitlines()) == n_rows + extra
    buf = io.StringIO()
    assert write_sql(sample_store, query, buf, "table", limit=0) == n_rows
    assert write_sql(sample_store, query, io.StringIO(), "csv", limit=5) == 5
    assert sql(sample_store, query, limit=3)[1] == [("train", 0), ("train", 1), ("train", 2)]
    r = _lmdata("sql", str(sample_store), query, "--limit", "2")
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("(first 2 rows shown"), r.stderr
    r = _lmdata("sql", str(sample_store), "SELECT 1; SELECT 2")
    assert r.returncode == 1 and r.stderr == "error: sql: the query holds 2 statements; give exactly one\n"


def test_output_formats():
    cols, rows = ["a", "b"], [(1, "x,y"), (2, None)]
    assert format_rows(cols, rows, "csv") == 'a,b\n1,"x,y"\n2,'
    assert json.loads(format_rows(cols, rows, "json")) == [{"a": 1, "b": "x,y"}, {"a": 2, "b": None}]
    assert format_rows(cols, rows, "table").splitlines()[2] == "1  x,y"

    odd = [(float("nan"), float("inf"), b"x\xff\\", [1.0, float("-inf")])]  # bare NaN is not JSON; b'..' is Python's
    assert json.loads(format_rows(["n", "i", "blob", "l"], odd, "json")) == [
        {"n": None, "i": None, "blob": "x\\xFF\\x5C", "l": [1.0, None]}]
    assert format_rows(["blob"], [(b"x\xff",)], "csv") == "blob\nx\\xFF"


def test_show_decodes_documents(sample_store):
    docs = [d.text for d in iter_documents(SourceSpec((str(SAMPLE),)))]
    assert show(sample_store, "validation", HOLDOUT - 1) == docs[-1]
    for fmt in FORMATS:
        assert show(sample_store, "train", 3, fmt) == docs[3]
    for bad in (55, -1, 1.5):  # (1.5 had been a NumPy IndexError from deep inside a reader)
        with pytest.raises(LmdataError, match=f"document {bad!r}: split 'train' has documents 0..54"):
            show(sample_store, "train", bad)


def test_cli_commands(sample_store, tokenizer_dir, tmp_path):
    r = _lmdata("inspect", str(sample_store), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["splits"]["validation"]["documents"] == HOLDOUT
    r = _lmdata("sql", str(sample_store), "SELECT split, count(*) AS n FROM docs GROUP BY split ORDER BY split",
                "--output", "csv")
    assert r.stdout.splitlines() == ["split,n", "train,55", f"validation,{HOLDOUT}"]
    r = _lmdata("sql", str(sample_store), "SELECT nope FROM docs")
    assert r.returncode == 1 and r.stderr.startswith("error: sql:") and "Traceback" not in r.stderr
    r = _lmdata("show", str(sample_store), "--split", "train", "--doc", "0")
    assert r.stdout.startswith("Fellow-Citizens of the Senate")
    doc = show(sample_store, "train", 0)  # printed as it is: a newline only where the document has none at its end
    assert r.stdout == (doc if doc.endswith("\n") else doc + "\n")
    assert _lmdata("verify", str(sample_store)).returncode == 0
    # the shipped pipeline, with the tokenizer and output overridden by flags
    out = tmp_path / "from-pipeline"
    r = _lmdata("ingest", "pipelines/sample.toml", "--tokenizer", str(tokenizer_dir), "--out", str(out),
                "--format", "memmap", "--workers", "1", "--no-progress")
    assert r.returncode == 0, r.stderr
    assert "validation: 6 documents" in r.stdout
    r = _lmdata("ingest", "--input", str(SAMPLE), "--tokenizer", str(tokenizer_dir), "--out", str(out),
                "--format", "memmap,zarr")
    assert r.returncode == 1 and r.stderr == ("error: ingest: --format 'zarr': no such format; valid formats: memmap, "
                                              "lance, parquet\n")


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
    reader = open_store(store).reader("train", "memmap")
    with pytest.raises(LmdataError, match="shard 00002"):
        reader.windows(reader._shard_bounds[2:3], 4)
    r = _lmdata("verify", str(store))
    assert r.returncode == 1 and "shard 00002" in r.stderr
    assert len(r.stderr.splitlines()) == 1 and f"(and {len(report.problems) - 1} more problem" in r.stderr
    listed = r.stdout.splitlines()  # every problem, one a line (the error line names the first)
    assert len(listed) == len(report.problems) > 1 and any("parquet" in line for line in listed), r.stdout


def test_bit_flipped_shard_is_found(sample_store, tmp_path):
    store = _damaged_copy(sample_store, tmp_path)
    path = store / "validation" / "memmap" / "tokens-00001.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    report = verify_store(store)
    assert not report.ok and "shard 00001" in report.problems[0] and "xxh128" in report.problems[0]
    r = _lmdata("verify", str(store))
    assert r.returncode == 1 and "shard 00001" in r.stderr


def test_an_ordinary_folder_is_not_told_to_resume_but_an_interrupted_ingest_is(tmp_path):
    """Issue 30.10: `lmdata inspect` on any folder without a manifest suggested `ingest --resume`."""
    from lmdata.store import open_store

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(LmdataError, match=r"not a store \(no manifest.json\); give a store") as err:
        open_store(tmp_path)
    assert "--resume" not in str(err.value)
    (tmp_path / "ingest-plan.json").write_text("{}")  # what an ingest writes first
    with pytest.raises(LmdataError, match=r"interrupted ingest .*--resume"):
        open_store(tmp_path)


def test_inspect_follows_a_shard_link_and_names_a_dangling_one(sample_store, tmp_path):
    """A shard file linked to its bytes elsewhere reads fine; inspect had measured the link and called it damaged."""
    store = tmp_path / "linked"
    shutil.copytree(sample_store, store)
    shard = next((store / "train" / "memmap").glob("tokens-*.bin"))
    moved = tmp_path / "moved.bin"
    shard.rename(moved)
    shard.symlink_to(moved)
    assert _lmdata("inspect", str(store)).returncode == 0
    moved.unlink()
    r = _lmdata("inspect", str(store))
    assert r.returncode == 1 and f"{shard.name} is missing" in r.stderr
