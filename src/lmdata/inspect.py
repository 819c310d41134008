"""Look inside a store: statistics (Polars), SQL (DuckDB), and documents decoded to text.

Everything here asks the store's readers (``lmdata.store.protocol``), never a format by
name. ``sql`` gives DuckDB lazy views, streams this process makes on demand while DuckDB
scans them, so DuckDB itself never opens a file and nothing is read up front:

    docs(split, doc_id, shard, n_tokens, token_offset)   every store; one batch per shard
        from a reader's ``doc_starts`` (memmap: docs-*.npy, Lance: its row sidecar,
        Parquet: the doc_id/token_offset columns), the store's default format first
    tokens(split, doc_id, token_offset, tokens)   per split, the rows of its first format
        that offers ``arrow_rows`` (a Parquet dataset: DuckDB pushes WHERE down to it; a
        fresh Lance scanner per scan, filtered by DuckDB); a long document spans several
        rows of <= 1,024 tokens, in order of ``token_offset``
    tokens_<format>    the same, per format that offers rows (e.g. tokens_parquet)

After the views exist, ``enable_external_access`` is switched off and the configuration
locked: the user's SQL (one statement, run as given, never spliced into other SQL) can
neither read nor write any file -- not even inside the store, where ``read_parquet`` would
have needed ``allowed_directories`` and so let ``COPY ... TO`` overwrite a shard.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from lmdata.errors import LmdataError
from lmdata.store.protocol import ShardInfo
from lmdata.store.registry import get_format
from lmdata.store.store import Store, open_store

PERCENTILES = (0.5, 0.9, 0.99)
OUTPUT_FORMATS = ("table", "csv", "json")
TABLE_LIMIT = 1000  # rows a table shows unless --limit says otherwise (csv/json stream all)


# ---------------------------------------------------------------------------- per-document index


def _reader_class(fmt: str) -> Any:
    try:
        return get_format(fmt).reader
    except LmdataError:  # a plug-in format that is not installed here
        return None


def _formats_with(store: Store, split: str, method: str) -> list[str]:
    """The split's formats whose reader offers ``method``, the store's default format first."""
    present = store.formats(split)
    if not present:
        return []
    order = [store.default_format(split)] + present
    return [f for f in dict.fromkeys(order) if hasattr(_reader_class(f), method)]


def _doc_starts_fn(store: Store, split: str) -> tuple[list[ShardInfo], Callable[[int], np.ndarray]]:
    """A format's shards and, per shard index, its document starts then its length: from
    ``doc_starts`` where a reader has it, else (a plug-in written before it) by measuring each
    document with ``document``."""
    formats = store.manifest.splits[split].formats
    fmts = _formats_with(store, split, "doc_starts")
    if fmts:
        return formats[fmts[0]], store.reader(split, fmts[0]).doc_starts
    fmt = next((f for f in store.formats(split) if _reader_class(f) is not None), None)
    if fmt is None:
        raise LmdataError(f"{store.path}: split {split!r} holds no format installed here "
                          f"({', '.join(store.formats(split))}); install its plug-in")
    reader, shards = store.reader(split, fmt), formats[fmt]

    def measured(i: int) -> np.ndarray:
        s = shards[i]
        lengths = [len(reader.document(d)) for d in range(s.first_doc, s.first_doc + s.n_docs)]
        return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)

    return shards, measured


def ingest_shard_docs(shards: list[ShardInfo]) -> np.ndarray:
    """First document of each ingest shard, then the split's document count: the ``shard`` the
    docs view names is the ingest's shard whatever the format (a Lance fragment holds several,
    listed in its ``extra["members"]``)."""
    firsts, doc = [], 0
    for s in shards:
        for m in s.extra.get("members", [{"n_docs": s.n_docs}]):
            firsts.append(doc)
            doc += int(m["n_docs"])
    return np.array(firsts + [doc], dtype=np.int64)


def doc_batches(store: Store, split: str) -> Iterator[Any]:
    """Record batches docs(split, doc_id, shard, n_tokens, token_offset) of one split, a shard at a time."""
    import pyarrow as pa

    if not store.manifest.splits[split].formats:
        return
    shards, starts_of = _doc_starts_fn(store, split)
    shard_docs = ingest_shard_docs(shards)
    for i, shard in enumerate(shards):
        starts = np.asarray(starts_of(i), dtype=np.int64)
        n = len(starts) - 1
        doc_ids = np.arange(shard.first_doc, shard.first_doc + n, dtype=np.int64)
        yield pa.RecordBatch.from_pydict({
            "split": pa.array([split] * n, pa.string()),
            "doc_id": doc_ids,
            "shard": np.searchsorted(shard_docs, doc_ids, side="right") - 1,
            "n_tokens": np.diff(starts),
            "token_offset": starts[:-1] + shard.first_token,
        }, schema=_docs_schema())


def _docs_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("split", pa.string()), ("doc_id", pa.int64()), ("shard", pa.int64()),
                      ("n_tokens", pa.int64()), ("token_offset", pa.int64())])


def doc_table(store: Store, split: str) -> Any:
    """Arrow table docs(split, doc_id, shard, n_tokens, token_offset) of one split."""
    import pyarrow as pa

    return pa.Table.from_batches(list(doc_batches(store, split)), schema=_docs_schema())


# ---------------------------------------------------------------------------- inspect


def inspect(store: str | Path) -> dict[str, Any]:
    """Per split and format: documents, tokens, shards, bytes on disk, bytes/token, doc lengths."""
    import polars as pl

    st = open_store(store)
    manifest = st.manifest
    extra = manifest.extra.get("splits", {})
    out: dict[str, Any] = {
        "store": str(st.path),
        "tokenizer": {"hash": manifest.tokenizer_hash, "vocab_size": manifest.vocab_size,
                      "eot_id": manifest.eot_id, "dtype": manifest.dtype},
        "splits": {},
    }
    for split, info in manifest.splits.items():
        lengths = pl.Series("n", doc_table(st, split).column("n_tokens").to_numpy())
        text_bytes = extra.get(split, {}).get("text_bytes")
        entry: dict[str, Any] = {
            "documents": info.n_docs,
            "tokens": info.n_tokens,
            "text_bytes": text_bytes,
            "text_bytes_per_token": None if text_bytes is None else round(text_bytes / max(1, info.n_tokens - info.n_docs), 3),
            "replaced_utf8": extra.get(split, {}).get("replaced", 0),
            "doc_tokens": {
                "min": int(lengths.min() or 0), "mean": round(float(lengths.mean() or 0), 1),
                **{f"p{int(q * 100)}": int(lengths.quantile(q, "nearest") or 0) for q in PERCENTILES},
                "max": int(lengths.max() or 0),
            },
            "formats": {},
        }
        for fmt, shards in info.formats.items():
            disk = _disk_bytes(st.format_dir(split, fmt))
            entry["formats"][fmt] = {"shards": len(ingest_shard_docs(shards)) - 1, "fragments": len(shards),
                                     "bytes": disk, "bytes_per_token": round(disk / max(1, info.n_tokens), 3)}
        out["splits"][split] = entry
    return out


def _disk_bytes(path: Any) -> int:
    """Bytes of every file under ``path`` (Lance's commit log and sidecars included; remote: one LIST)."""
    if getattr(path, "remote", False):
        return sum(x.size or 0 for x in path.fs.get_file_info(_selector(path)))
    return sum(os.lstat(os.path.join(root, f)).st_size for root, _, names in os.walk(path) for f in names)


def _selector(loc: Any) -> Any:
    import pyarrow.fs as pafs

    return pafs.FileSelector(loc.fs_path, recursive=True, allow_not_found=True)


def format_inspect(report: dict[str, Any]) -> str:
    """The human-readable form of ``inspect``'s report."""
    t = report["tokenizer"]
    lines = [f"store {report['store']}: tokenizer {t['hash'][:19]} (vocab {t['vocab_size']:,}, "
             f"eot {t['eot_id']}, {t['dtype']})"]
    for split, s in report["splits"].items():
        bpt = "" if s["text_bytes_per_token"] is None else f", {s['text_bytes_per_token']} text bytes/token"
        d = s["doc_tokens"]
        lines.append(f"  {split}: {s['documents']:,} documents, {s['tokens']:,} tokens{bpt}")
        lines.append("    tokens/document: " + ", ".join(f"{k} {v:,}" for k, v in d.items()))
        if s["replaced_utf8"]:
            lines.append(f"    {s['replaced_utf8']:,} invalid UTF-8 sequences were replaced by U+FFFD")
        for fmt, f in s["formats"].items():
            grouped = "" if f["fragments"] == f["shards"] else f" in {f['fragments']} fragment{'s' * (f['fragments'] > 1)}"
            lines.append(f"    {fmt:8s} {f['shards']:5d} shards{grouped:<17s} {f['bytes']:>14,} bytes  "
                         f"{f['bytes_per_token']:.3f} bytes/token")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- sql


class _Rescannable:
    """An Arrow stream DuckDB can scan any number of times: ``batches()`` is called afresh per scan.

    An ``LmdataError`` raised while making batches is kept in ``errors`` too, so the user sees
    it as it was (DuckDB wraps it in a message with a traceback).
    """

    def __init__(self, schema: Any, batches: Callable[[], Iterator[Any]], errors: list[LmdataError]) -> None:
        self.schema, self.batches, self.errors = schema, batches, errors

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        import pyarrow as pa

        def guarded() -> Iterator[Any]:
            try:
                yield from self.batches()
            except LmdataError as exc:
                self.errors.append(exc)
                raise

        return pa.RecordBatchReader.from_batches(self.schema, guarded()).__arrow_c_stream__(requested_schema)


def _ident(name: str) -> str:
    """A DuckDB identifier for a view we name (format names are checked by ``register_format``)."""
    return '"' + name.replace('"', '""') + '"'


def connect(store: str | Path, errors: list[LmdataError] | None = None, sources: dict[str, Any] | None = None) -> Any:
    """A DuckDB connection with the store's lazy views, then locked away from every file.

    ``errors`` collects the ``LmdataError``s met while DuckDB scans the docs view;
    ``sources`` receives the reader behind each registered rows stream (``_rows_<j>_<k>``).
    """
    import duckdb
    import pyarrow as pa

    st = open_store(store)
    con = duckdb.connect(":memory:")
    splits = st.splits
    docs = _Rescannable(_docs_schema(), lambda: (b for s in splits for b in doc_batches(st, s)),
                        [] if errors is None else errors)
    con.register("_docs", docs)
    con.execute("CREATE VIEW docs AS SELECT * FROM _docs")
    per_format: dict[str, list[str]] = {}
    first: list[str] = []
    for j, split in enumerate(splits):
        for k, fmt in enumerate(_formats_with(st, split, "arrow_rows")):
            reader = st.reader(split, fmt)
            con.register(f"_rows_{j}_{k}", reader.arrow_rows())
            if sources is not None:
                sources[f"_rows_{j}_{k}"] = reader
            part = f"SELECT {j} AS _s, doc_id, token_offset, tokens FROM _rows_{j}_{k}"
            per_format.setdefault(fmt, []).append(part)
            first += [part] if k == 0 else []
    # split names come in through a joined table, never through SQL text
    con.register("_split_names", pa.table({"_s": pa.array(range(len(splits)), pa.int64()),
                                           "split": pa.array(splits, pa.string())}))
    views = {f"tokens_{fmt}": parts for fmt, parts in per_format.items()}
    for name, parts in {**({"tokens": first} if first else {}), **views}.items():
        con.execute(f"CREATE VIEW {_ident(name)} AS SELECT n.split, r.doc_id, r.token_offset, r.tokens "
                    f"FROM ({' UNION ALL '.join(parts)}) r JOIN _split_names n USING (_s)")
    con.execute("SET autoinstall_known_extensions=false")
    con.execute("SET autoload_known_extensions=false")
    con.execute("SET enable_external_access=false")
    con.execute("SET lock_configuration=true")
    return con


def _damaged_shard(reader: Any) -> str | None:
    """After a scan of ``reader``'s rows failed inside DuckDB (whose message names no file):
    the first shard whose files fail their sha256, as the error to show, else None."""
    from lmdata.store.checksum import verify_shard

    for shard in getattr(reader, "shards", []):
        try:
            verify_shard(reader.format_dir, shard, "first-use")
        except LmdataError as exc:
            return str(exc)
    return None


@contextmanager
def _query(store: str | Path, query: str) -> Iterator[tuple[list[str], Iterator[list[tuple]]]]:
    """Run the user's one statement, as given: (column names, batches of rows fetched on demand)."""
    import duckdb

    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise LmdataError(f"sql: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise LmdataError(f"sql: the query holds {len(statements)} statements; give exactly one")
    errors: list[LmdataError] = []
    sources: dict[str, Any] = {}

    def error(exc: Exception) -> LmdataError:
        text = str(exc).splitlines()[0]
        stream = re.search(r"'(_rows_\d+_\d+)'", text)
        damaged = _damaged_shard(sources[stream.group(1)]) if not errors and stream and stream.group(1) in sources else None
        return LmdataError(f"sql: {errors[0] if errors else damaged or text}")

    con = connect(store, errors, sources)
    try:
        try:
            cur = con.execute(statements[0])
        except duckdb.Error as exc:
            raise error(exc) from None
        columns = [d[0] for d in cur.description] if cur.description is not None else []

        def batches() -> Iterator[list[tuple]]:
            while columns:
                try:
                    rows = cur.fetchmany(4096)
                except duckdb.Error as exc:
                    raise error(exc) from None
                if not rows:
                    return
                yield rows

        yield columns, batches()
    finally:
        con.close()


def _rows(batches: Iterator[list[tuple]], limit: int | None) -> Iterator[tuple]:
    """The rows of ``batches``, at most ``limit`` of them (None: all)."""
    n = 0
    for batch in batches:
        for row in batch:
            if limit is not None and n >= limit:
                return
            n += 1
            yield row


def sql(store: str | Path, query: str, limit: int | None = None) -> tuple[list[str], list[tuple]]:
    """Run the user's ``query`` (one statement, as given): (column names, up to ``limit`` rows)."""
    with _query(store, query) as (columns, batches):
        return columns, list(_rows(batches, limit))


def write_sql(store: str | Path, query: str, out: TextIO, fmt: str = "table", limit: int | None = None) -> int:
    """Run ``query`` and write its result to ``out``; returns the rows written.

    csv and json stream every row (``limit``: at most that many); a table is aligned in
    memory, so it shows ``TABLE_LIMIT`` rows unless ``limit`` says otherwise (0: all) and
    ends with a note when rows were left out.
    """
    if fmt not in OUTPUT_FORMATS:
        raise LmdataError(f"--format {fmt!r}: choose one of {', '.join(OUTPUT_FORMATS)}")
    if limit is not None and limit < 0:
        raise LmdataError(f"--limit {limit}: give a number of rows >= 0 (0: no limit)")
    cap = (TABLE_LIMIT if fmt == "table" else None) if limit is None else (limit or None)
    with _query(store, query) as (columns, batches):
        if not columns:
            return 0
        if fmt != "table":
            return write_rows(columns, _rows(batches, cap), out, fmt)
        rows = list(_rows(batches, None if cap is None else cap + 1))
        more = cap is not None and len(rows) > cap
        out.write(format_rows(columns, rows[:cap], "table") + "\n")
        if more:
            out.write(f"(first {cap:,} rows shown; --limit N for more, 0 for all, or --format csv|json)\n")
        return len(rows[:cap])


def write_rows(columns: list[str], rows: Any, out: TextIO, fmt: str) -> int:
    """Stream ``rows`` to ``out`` as ``csv`` or ``json`` (a list of objects); returns their count."""
    n = 0
    if fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(columns)
        for n, row in enumerate(rows, 1):
            w.writerow(row)
        return n
    out.write("[")
    for n, row in enumerate(rows, 1):
        out.write((", " if n > 1 else "") + json.dumps(dict(zip(columns, row)), default=str))
    out.write("]\n")
    return n


def format_rows(columns: list[str], rows: list[tuple], fmt: str = "table") -> str:
    """Rows as ``table`` (aligned text), ``csv`` or ``json`` (a list of objects)."""
    if fmt in ("csv", "json"):
        buf = io.StringIO()
        write_rows(columns, rows, buf, fmt)
        return buf.getvalue().rstrip("\n")
    if fmt != "table":
        raise LmdataError(f"--format {fmt!r}: choose one of {', '.join(OUTPUT_FORMATS)}")
    cells = [columns] + [[_cell(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any, limit: int = 60) -> str:
    s = "NULL" if value is None else str(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


# ---------------------------------------------------------------------------- show


def show(store: str | Path, split: str, doc: int, format: str | None = None) -> str:
    """Document ``doc`` of ``split`` decoded back to text (its end-of-text id dropped)."""
    st = open_store(store)
    ids = st.document(split, doc, format)
    if len(ids) and int(ids[-1]) == st.eot_id:
        ids = ids[:-1]
    return st.tokenizer().decode([int(i) for i in ids])
