"""``lmdata sql`` views are unions of shard groups: a WHERE on doc_id or token_offset reads only
the groups it can match, and every query answers exactly as one stream over all shards did.

At 11,761 shards a 1-document WHERE had read and hashed every shard (13 s; 1.7 s with groups).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest

from lmdata.inspect import sql
from lmdata.inspect.sandbox import MAX_GROUPS, connect, shard_groups
from lmdata.inspect.tables import SplitDocs, doc_table, formats_with
from lmdata.store import open_store
from lmdata.store.formats.rows import VerifiedRows


@dataclass
class Shard:
    first_doc: int
    n_docs: int
    first_token: int
    n_tokens: int


def _shards(rng: random.Random, n: int) -> list[Shard]:
    out, doc, tok = [], 0, 0
    for _ in range(n):
        docs, toks = rng.randint(1, 50), rng.randint(60, 5000)
        out.append(Shard(doc, docs, tok, toks))
        doc, tok = doc + docs, tok + toks
    return out


@pytest.mark.parametrize("n", [0, 1, 2, 3, 14, 99, 100, 101, 1000, 11_761, 300_000])
def test_groups_tile_the_shards_in_order_and_bound_their_rows(n):
    shards = _shards(random.Random(n), n)
    groups = shard_groups(shards)
    assert [i for g, _ in groups for i in g] == list(range(n))  # every shard once, in order
    assert len(groups) <= MAX_GROUPS and (not n or len(groups) <= int(np.ceil(np.sqrt(n))))
    for g, where in groups:
        first, last = shards[g[0]], shards[g[-1]]
        assert where == (f"doc_id BETWEEN {first.first_doc} AND {last.first_doc + last.n_docs - 1} AND "
                         f"token_offset BETWEEN {first.first_token} AND {last.first_token + last.n_tokens - 1}")


def _group_reads(monkeypatch) -> list[tuple[str, range | None]]:
    """Which (stream kind, shard range) a query actually pulled batches from."""
    reads: list[tuple[str, range | None]] = []

    def recorded(kind, real):
        def batches(self, shards=None):
            it = real(self, shards)
            for i, batch in enumerate(it):
                if i == 0:
                    reads.append((kind, shards))
                yield batch
        return batches

    monkeypatch.setattr(VerifiedRows, "batches", recorded("rows", VerifiedRows.batches))
    monkeypatch.setattr(SplitDocs, "batches", recorded("docs", SplitDocs.batches))
    return reads


def _group_of(shards, doc: int) -> range | None:
    return next((g for g, _ in shard_groups(shards)
                 if shards[g[0]].first_doc <= doc < shards[g[-1]].first_doc + shards[g[-1]].n_docs), None)


@pytest.mark.parametrize("view", ["tokens", "tokens_parquet", "tokens_lance"])
def test_a_where_on_doc_id_reads_one_group_a_split_and_answers_exactly(sample_store, monkeypatch, view):
    store = open_store(sample_store)
    fewest = {split: min(formats_with(store, split, "arrow_rows"), key=lambda f: len(store.manifest.splits[split].formats[f]))
              for split in store.splits}  # what the tokens view reads
    fmt = {split: view.removeprefix("tokens_") if view != "tokens" else fewest[split] for split in store.splits}
    shards = {split: store.reader(split, fmt[split]).arrow_rows().shards for split in store.splits}  # row units
    assert len(shard_groups(shards["train"])) > 1  # groups to skip (14 ingest shards: 4; Lance: its members)
    reads = _group_reads(monkeypatch)
    con = connect(sample_store)
    try:
        for split in store.splits:
            # the first and last document of every group: the edges a wrong bound would miss
            edges = sorted({d for g, _ in shard_groups(shards[split])
                            for d in (shards[split][g[0]].first_doc,
                                      shards[split][g[-1]].first_doc + shards[split][g[-1]].n_docs - 1)})
            for doc in edges:
                reads.clear()
                rows = con.execute(f"SELECT token_offset, tokens FROM {view} WHERE split = ? AND doc_id = ? "
                                   "ORDER BY token_offset", [split, doc]).fetchall()
                got = np.concatenate([np.asarray(t, dtype=np.int64) for _, t in rows])
                assert np.array_equal(got, store.reader(split, "memmap").document(doc))
                # the group holding the document, in each split that has one (the split's name is
                # joined in after the groups: a doc_id is matched in every split)
                want = [("rows", g) for g in (_group_of(shards[s], doc) for s in store.splits) if g is not None]
                assert sorted(reads, key=str) == sorted(want, key=str), (split, doc, reads)
    finally:
        con.close()


def test_docs_view_by_doc_id_and_token_offset_reads_one_group(sample_store, monkeypatch):
    store = open_store(sample_store)
    table = doc_table(store, "train").to_pylist()
    reads = _group_reads(monkeypatch)
    con = connect(sample_store)
    try:
        for row in (table[0], table[len(table) // 2], table[-1]):
            reads.clear()
            got = con.execute("SELECT * FROM docs WHERE split = 'train' AND doc_id = ?", [row["doc_id"]]).fetchall()
            assert got == [tuple(row.values())]
            assert 1 <= len(reads) <= len(store.splits) and {k for k, _ in reads} == {"docs"}  # a group a split at most
            reads.clear()
            got = con.execute("SELECT doc_id FROM docs WHERE split = 'train' AND token_offset = ?",
                              [row["token_offset"]]).fetchall()
            assert got == [(row["doc_id"],)] and 1 <= len(reads) <= len(store.splits)
    finally:
        con.close()


def test_whole_views_are_unchanged_by_the_groups(sample_store):
    """Every row once: the unions hold what one stream over every shard held."""
    store = open_store(sample_store)
    for split in store.splits:
        total = store.manifest.splits[split].n_tokens
        for view in ("tokens", "tokens_parquet", "tokens_lance"):
            _, rows = sql(sample_store, f"SELECT count(DISTINCT token_offset), sum(len(tokens)) FROM {view} "
                                        f"WHERE split = '{split}'")
            assert rows[0][1] == total, view
        _, rows = sql(sample_store, f"SELECT list(doc_id ORDER BY doc_id), sum(n_tokens) FROM docs WHERE split = '{split}'")
        assert rows[0][0] == list(range(store.manifest.splits[split].n_docs)) and rows[0][1] == total


def test_arrays_from_buffers_equal_pyarrows_own():
    import pyarrow as pa

    from lmdata.inspect.tables import arrow_int64, arrow_strings

    for strings in ([], ["train"], ["a", "", "é/ü path", "x" * 300]):
        assert arrow_strings(strings).equals(pa.array(strings, pa.string()))
    for values in (np.zeros(0, dtype=np.int64), np.arange(5), np.array([3, -1, 2**40], dtype=np.int64)[::2]):
        assert arrow_int64(values).equals(pa.array(values, pa.int64()))


def test_the_docs_view_does_not_import_pandas(sample_store):
    """``pa.array`` of a NumPy array imports pandas to ask whether it is one (~0.2 s of each query)."""
    import subprocess
    import sys

    script = ("import sys; from lmdata.inspect import sql; "
              f"print(sql({str(sample_store)!r}, 'SELECT count(*), sum(n_tokens) FROM docs WHERE doc_id = 3')[1]); "
              "print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[1] == "False", out


def test_a_split_in_a_format_not_installed_here_fails_only_the_scans_of_it(tmp_path):
    """Opening the views reads nothing: a store held in a plug-in format this process lacks still answers
    what needs none of its rows (``SELECT 1``, ``SHOW TABLES``); a scan of its docs says why, in one line."""
    import subprocess
    import sys

    from lmdata.store.registry import register_format, unregister_format
    from toyformat import ToyReader, ToyWriter, build_store

    register_format("toy", ToyWriter, ToyReader)
    try:
        store = tmp_path / "store"
        build_store(store, ["toy"])
    finally:
        unregister_format("toy")
    script = ("import sys; from lmdata.inspect import sql; from lmdata.errors import LmdataError\n"
              "print(sql(sys.argv[1], 'SELECT 42')[1])\n"
              "print(len(sql(sys.argv[1], 'SHOW TABLES')[1]) > 0)\n"
              "try: sql(sys.argv[1], 'SELECT count(*) FROM docs')\n"
              "except LmdataError as exc: print(exc)")  # a fresh process: the plug-in is not registered there
    out = subprocess.run([sys.executable, "-c", script, str(store)], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[:2] == ["[(42,)]", "True"], out
    assert lines[2].startswith("sql: ") and "holds no format installed here (toy)" in lines[2], lines


def test_lance_rows_are_served_by_ingest_shard_not_by_fragment(sample_store):
    """A fragment holds up to 256 Mi tokens: its ingest shards (``members``) are the units a WHERE skips."""
    from lmdata.store.formats.rows import member_units

    store = open_store(sample_store)
    fragments = store.manifest.splits["train"].formats["lance"]
    units = member_units(fragments)
    assert len(fragments) == 1 and len(units) == len(store.manifest.splits["train"].formats["parquet"]) > 1
    for parquet_shard, unit in zip(store.manifest.splits["train"].formats["parquet"], units):
        assert (unit.first_doc, unit.n_docs, unit.first_token, unit.n_tokens) == (
            parquet_shard.first_doc, parquet_shard.n_docs, parquet_shard.first_token, parquet_shard.n_tokens)
    assert [u.row for u in units] == list(np.cumsum([0] + [u.rows for u in units[:-1]]))
    assert sum(u.rows for u in units) == fragments[0].extra["rows"]
    # a fragment recorded without its members (or their rows) is one unit
    bare = [type(fragments[0])(**{**fragments[0].__dict__, "extra": {"rows": fragments[0].extra["rows"]}})]
    (whole,) = member_units(bare)
    assert (whole.row, whole.rows, whole.n_tokens) == (0, fragments[0].extra["rows"], fragments[0].n_tokens)
    # members that do not add up to their fragment (edited by hand, damaged): the whole fragment, one unit
    members = [dict(m) for m in fragments[0].extra["members"]]
    members[-1]["n_tokens"] += 1
    odd = [type(fragments[0])(**{**fragments[0].__dict__, "extra": {**fragments[0].extra, "members": members}})]
    assert len(member_units(odd)) == 1


def test_the_tokens_view_reads_the_format_in_the_fewest_files(sample_store, tmp_path, monkeypatch):
    """Lance's fragments before Parquet's shards, whatever the manifest's order (its whole view: 11,761
    shards in 2.0-2.6 s against 8.6-12 s)."""
    import shutil

    from lmdata.store.manifest import read_manifest, write_manifest

    store = tmp_path / "store"
    shutil.copytree(sample_store, store)
    manifest = read_manifest(store)
    for info in manifest.splits.values():  # Parquet listed before Lance
        order = ["memmap", "parquet", "lance"]
        info.formats = {f: info.formats[f] for f in order}
    write_manifest(store, manifest)
    read_by: list[str] = []
    real = VerifiedRows.batches

    def batches(self, units=None):
        read_by.append(type(self.reader).__name__)
        yield from real(self, units)

    monkeypatch.setattr(VerifiedRows, "batches", batches)
    _, rows = sql(store, "SELECT count(*) FROM tokens WHERE split = 'train'")
    assert rows[0][0] > 0 and set(read_by) == {"LanceReader"}


def test_consecutive_units_of_a_fragment_are_scanned_as_one():
    from lmdata.store.formats.rows import RowUnit, runs

    a = [RowUnit(0, f"f0 ({k})", 10 * k, 10, 1000 * k, 1000, 7 * k, 7) for k in range(3)]
    b = [RowUnit(1, "f1 (3)", 30, 10, 3000, 1000, 0, 7), RowUnit(2, "p", 40, 5, 4000, 500, 0, None),
         RowUnit(2, "q", 45, 5, 4500, 500, 0, None)]
    merged = runs(a + b)
    assert [(u.shard, u.first_doc, u.n_docs, u.first_token, u.n_tokens, u.row, u.rows) for u in merged] == [
        (0, 0, 30, 0, 3000, 0, 21), (1, 30, 10, 3000, 1000, 0, 7), (2, 40, 5, 4000, 500, 0, None),
        (2, 45, 5, 4500, 500, 0, None)]  # rows unknown: never merged (each is a whole file)
    assert merged[0].name == "f0 (0) to f0 (2)"
    assert runs(a[::2]) == a[::2]  # not adjacent rows: two scans
