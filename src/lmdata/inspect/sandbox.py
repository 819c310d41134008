"""``lmdata sql``: DuckDB over a store, sandboxed.

Everything here asks the store's readers (``lmdata.store.protocol``), never a format by
name. ``sql`` gives DuckDB lazy views, streams this process makes on demand while DuckDB
scans them, so DuckDB itself never opens a file and nothing is read up front:

    docs(split, doc_id, shard, n_tokens, token_offset, source, source_offset)   every store;
        from a reader's ``doc_starts`` (memmap: docs-*.npy, Lance: its row sidecar,
        Parquet: the doc_id/token_offset columns), the store's default format first
    tokens(split, doc_id, token_offset, tokens)   per split, the rows of the format that offers
        ``arrow_rows`` in the fewest files (Lance's fragments before Parquet's shards: its whole
        view reads 11,761 shards in 1.8 s against 9.5 s; each shard verified before its rows are
        served); a long document spans several rows of <= 1,024 tokens, in order of ``token_offset``
    tokens_<format>    the same, per format that offers rows (e.g. tokens_parquet)

Each view is a UNION ALL of streams over groups of consecutive shards (``shard_groups``),
each under its doc_id and token_offset ranges: DuckDB drops the groups a WHERE on either
column cannot match without reading them, so ``WHERE doc_id = 1000`` reads one group of
shards, not the store (11,761 shards: 13 s -> about 1 s).

After the views exist, ``enable_external_access`` is switched off and the configuration
locked: the user's SQL (one statement, run as given, never spliced into other SQL) can
neither read nor write any file -- not even inside the store, where ``read_parquet`` would
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from lmdata.errors import LmdataError
from lmdata.io.bounded import Bounded
from lmdata.inspect.tables import SplitDocs, arrow_int64, arrow_strings, docs_schema, formats_with
from lmdata.store.store import open_store
from lmdata.store.protocol import FormatReader

OUTPUT_FORMATS = ("table", "csv", "json")
STOP_S = 30.0  # how long a Ctrl-C repeats DuckDB's interrupt before leaving the query to the exit
TABLE_LIMIT = 1000  # rows a table shows unless --limit says otherwise (csv/json stream all)


class _Rescannable:
    """An Arrow stream DuckDB can scan any number of times: ``batches()`` is called afresh per scan.

    An ``LmdataError`` raised while making batches is kept in ``errors`` too, so the user sees
    it as it was (DuckDB wraps it in a message with a traceback). ``lock``: shared by every stream
    of a connection, so DuckDB's threads never run two of our readers' batches at once (a view is a
    UNION ALL of several streams, which DuckDB may scan in parallel).
    """

    def __init__(self, schema: Any, batches: Callable[[], Iterator[Any]], errors: list[LmdataError],
                 lock: Any = None) -> None:
        self.schema, self.batches, self.errors = schema, batches, errors
        self.lock = lock if lock is not None else threading.Lock()

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        import pyarrow as pa

        def guarded() -> Iterator[Any]:
            try:
                it = self.batches()
                while True:
                    with self.lock:
                        batch = next(it, None)
                    if batch is None:
                        return
                    yield batch
            except LmdataError as exc:
                self.errors.append(exc)
                raise

        return pa.RecordBatchReader.from_batches(self.schema, guarded()).__arrow_c_stream__(requested_schema)


MAX_GROUPS = 512  # streams per split and view: what a query binds, against what a WHERE skips


def shard_groups(shards: list[Any]) -> list[tuple[range, str]]:
    """Consecutive shards in about ``sqrt(len(shards))`` groups (at most ``MAX_GROUPS``), each with
    the SQL condition its rows meet: their doc_id and token_offset ranges. A view made of one stream
    per group, each under its condition, lets DuckDB drop every group a WHERE on doc_id or
    token_offset cannot match before it reads a shard. A group costs ~1.3 ms to register and bind (its
    stream in each view) and a shard ~1.1 ms to read, so sqrt(n) groups of sqrt(n) shards keep
    both small (11,761 shards: 109 groups of 108)."""
    n = len(shards)
    if not n:
        return []
    size = -(-n // min(MAX_GROUPS, math.isqrt(n - 1) + 1))  # ceil(n / ceil(sqrt(n)))
    out = []
    for lo in range(0, n, size):
        first, last = shards[lo], shards[min(lo + size, n) - 1]
        docs = (first.first_doc, last.first_doc + last.n_docs - 1)
        tokens = (first.first_token, last.first_token + last.n_tokens - 1)
        out.append((range(lo, min(lo + size, n)), f"doc_id BETWEEN {int(docs[0])} AND {int(docs[1])} "
                                                  f"AND token_offset BETWEEN {int(tokens[0])} AND {int(tokens[1])}"))
    return out


def _ident(name: str) -> str:
    """A DuckDB identifier for a view we name (format names are checked by ``register_format``)."""
    return '"' + name.replace('"', '""') + '"'


def connect(store: str | Path, errors: list[LmdataError] | None = None, sources: dict[str, Any] | None = None) -> Any:
    """A DuckDB connection with the store's lazy views, then locked away from every file.

    ``errors`` collects the ``LmdataError``s met while DuckDB scans the docs view;
    ``sources`` receives the reader behind each registered rows stream (``_rows_<j>_<k>_<group>``).
    """
    import duckdb
    import pyarrow as pa

    st = open_store(store)
    con = duckdb.connect(":memory:")
    splits = st.splits
    errors = [] if errors is None else errors
    lock = threading.Lock()
    doc_parts = []
    for j, split in enumerate(splits):
        if not st.manifest.splits[split].formats:
            continue
        docs = SplitDocs(st, split)
        for g, (group, where) in enumerate(shard_groups(docs.shards)):
            con.register(f"_docs_{j}_{g}", _Rescannable(docs_schema(), partial(docs.batches, group), errors, lock))
            doc_parts.append(f"SELECT * FROM _docs_{j}_{g} WHERE {where}")
    if not doc_parts:  # a store without any shard still has the (empty) view
        con.register("_docs_none", _Rescannable(docs_schema(), lambda: iter(()), errors, lock))
        doc_parts.append("SELECT * FROM _docs_none")
    con.execute(f"CREATE VIEW docs AS {' UNION ALL '.join(doc_parts)}")
    per_format: dict[str, list[str]] = {}
    first: list[str] = []
    for j, split in enumerate(splits):
        fmts = formats_with(st, split, "arrow_rows")  # the fewest files first: the `tokens` view scans it
        for k, fmt in enumerate(sorted(fmts, key=lambda f: len(st.manifest.splits[split].formats[f]))):
            reader = st.reader(split, fmt)
            rows = reader.arrow_rows()
            if hasattr(rows, "shards") and hasattr(rows, "batches"):  # ours: by groups of shards
                streams = [(f"_rows_{j}_{k}_{g}", _Rescannable(rows.schema, partial(rows.batches, group), errors, lock),
                            f" WHERE {where}") for g, (group, where) in enumerate(shard_groups(rows.shards))]
            elif hasattr(rows, "batches") and hasattr(rows, "schema"):  # our errors reach the user as they were
                streams = [(f"_rows_{j}_{k}", _Rescannable(rows.schema, rows.batches, errors, lock), "")]
            else:  # a plug-in's own Arrow object (a pyarrow dataset, a table): DuckDB scans it whole
                streams = [(f"_rows_{j}_{k}", rows, "")]
            for name, stream, where in streams:
                con.register(name, stream)
                if sources is not None:
                    sources[name] = reader
                part = f"SELECT {j} AS _s, doc_id, token_offset, tokens FROM {name}{where}"
                per_format.setdefault(fmt, []).append(part)
                first += [part] if k == 0 else []
    # split names come in through a joined table, never through SQL text
    con.register("_split_names", pa.table({"_s": arrow_int64(np.arange(len(splits))), "split": arrow_strings(splits)}))
    views = {f"tokens_{fmt}": parts for fmt, parts in per_format.items()}
    for name, parts in {**({"tokens": first} if first else {}), **views}.items():
        con.execute(f"CREATE VIEW {_ident(name)} AS SELECT n.split, r.doc_id, r.token_offset, r.tokens "
                    f"FROM ({' UNION ALL '.join(parts)}) r JOIN _split_names n USING (_s)")
    con.execute("SET autoinstall_known_extensions=false")
    con.execute("SET autoload_known_extensions=false")
    con.execute("SET enable_external_access=false")
    con.execute("SET lock_configuration=true")
    return con


def _damaged_shard(reader: FormatReader) -> str | None:
    """After a scan of ``reader``'s rows failed inside DuckDB (whose message names no file):
    the first shard whose files fail their checksums, as the error to show, else None."""
    from lmdata.store.checksum import verify_shard

    for shard in getattr(reader, "shards", []):
        try:
            verify_shard(reader.format_dir, shard, "first-use")
        except LmdataError as exc:
            return str(exc)
    return None


def _interruptible(con: Any, call: Callable[[], Any], stuck: list[bool]) -> Any:
    """``call()`` (a DuckDB execute or fetch) on a thread while the main thread waits in Python.

    DuckDB looks for Ctrl-C only now and then: a running query ignored it, or raised
    ``RuntimeError: Query interrupted`` with a traceback (issue 29.11). Waiting in Python, the
    main thread takes the KeyboardInterrupt at once; the query is interrupted and the CLI
    prints its one line (exit 130).

    DuckDB forgets an interrupt that lands before it begins the query (it clears the flag at
    the start), so the interrupt is repeated until the call returns: CI saw one Ctrl-C leave
    the query running and ``con.close()`` waiting on it for good. A query that outlives
    ``STOP_S`` of interrupts is left to the process's exit (``stuck``), never waited on.
    """
    running = Bounded(call, "lmdata-sql")
    try:
        running.wait()
    except KeyboardInterrupt:
        deadline = time.monotonic() + STOP_S
        while True:
            con.interrupt()
            if running.wait(0.1):
                break
            if time.monotonic() >= deadline:
                stuck.append(True)
                break
        raise
    return running.result()


QUERY_ERRORS = ("Parser Error", "Binder Error", "Catalog Error")  # DuckDB's words for a query that is wrong
VIEWS = ("docs(split, doc_id, shard, n_tokens, token_offset, source, source_offset) and, where the store has "
         "Parquet or Lance, tokens(split, doc_id, token_offset, tokens)")


def _with_hint(text: str, views: str = VIEWS) -> str:
    """DuckDB's first line; for a query that is wrong (not a damaged store), what there is to query."""
    return f"{text}; fix the query: the views are {views}" if text.startswith(QUERY_ERRORS) else text


def _views_of(con: Any) -> str:
    """The views this store's connection has, with their columns (a memmap-only store has no ``tokens``); the
    general list where the connection cannot say (a fatal DuckDB error)."""
    try:
        rows = con.execute("SELECT table_name, list(column_name ORDER BY column_index) FROM duckdb_columns() "
                           "WHERE NOT internal AND NOT starts_with(table_name, '_') "
                           "AND table_name IN (SELECT view_name FROM duckdb_views() WHERE NOT internal) "
                           "GROUP BY table_name ORDER BY table_name = 'docs' DESC, table_name").fetchall()
    except Exception:
        return VIEWS
    return ", ".join(f"{name}({', '.join(cols)})" for name, cols in rows) or VIEWS


@contextmanager
def _query(store: str | Path, query: str) -> Iterator[tuple[list[str], Iterator[list[tuple]]]]:
    """Run the user's one statement, as given: (column names, batches of rows fetched on demand)."""
    import duckdb

    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as exc:
        raise LmdataError(f"sql: {_with_hint(str(exc).splitlines()[0])}") from None
    if len(statements) != 1:
        raise LmdataError(f"sql: the query holds {len(statements)} statements; give exactly one")
    errors: list[LmdataError] = []
    sources: dict[str, Any] = {}

    def error(exc: Exception) -> LmdataError:
        text = str(exc).splitlines()[0]
        stream = re.search(r"'(_rows_\d+_\d+(?:_\d+)?)'", text)
        damaged = _damaged_shard(sources[stream.group(1)]) if not errors and stream and stream.group(1) in sources else None
        hinted = _with_hint(text, _views_of(con)) if text.startswith(QUERY_ERRORS) else text
        return LmdataError(f"sql: {errors[0] if errors else damaged or hinted}")

    con = connect(store, errors, sources)
    stuck: list[bool] = []  # a query that would not stop: closing would wait on it
    try:
        try:
            cur = _interruptible(con, lambda: con.execute(statements[0]), stuck)
        except duckdb.Error as exc:
            raise error(exc) from None
        columns = [d[0] for d in cur.description] if cur.description is not None else []

        def batches() -> Iterator[list[tuple]]:
            while columns:
                try:
                    rows = _interruptible(con, lambda: cur.fetchmany(4096), stuck)
                except duckdb.Error as exc:
                    raise error(exc) from None
                if not rows:
                    return
                yield rows

        yield columns, batches()
    finally:
        if not stuck:
            _close(con)


def _close(con: Any) -> None:
    """``con.close()`` once no call runs on it. A Ctrl-C that lands while ``_interruptible`` starts
    its thread (``Thread.start`` waits for it) leaves before the interrupts, with the query running;
    DuckDB (2.x) refuses to close a busy connection (``ResourceInUseException``), which then replaced
    the KeyboardInterrupt with a traceback, and the running query aborted the exit ("FATAL: exception
    not rethrown"; seen once, in a test run beside other load). Such a query is interrupted here
    until the connection closes, or left to the exit after ``STOP_S``, as ``_interruptible`` does."""
    import duckdb

    busy = getattr(duckdb, "ResourceInUseException", ())  # DuckDB 1.x waits instead
    deadline = time.monotonic() + STOP_S
    while True:
        try:
            con.close()
            return
        except busy:
            if time.monotonic() >= deadline:
                return
            con.interrupt()
            time.sleep(0.1)


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
        raise LmdataError(f"--output {fmt!r}: choose one of {', '.join(OUTPUT_FORMATS)}")
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
            out.write(f"(first {cap:,} rows shown; --limit N for more, 0 for all, or --output csv|json)\n")
        return len(rows[:cap])


def write_rows(columns: list[str], rows: Any, out: TextIO, fmt: str) -> int:
    """Stream ``rows`` to ``out`` as ``csv`` or ``json`` (a list of objects); returns their count."""
    n = 0
    if fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(columns)
        for n, row in enumerate(rows, 1):
            w.writerow([_blob_text(v) if isinstance(v, bytes) else v for v in row])
        return n
    out.write("[")
    for n, row in enumerate(rows, 1):
        out.write((", " if n > 1 else "") + json.dumps({c: _json_value(v) for c, v in zip(columns, row)},
                                                       default=str, allow_nan=False))
    out.write("]\n")
    return n


def _json_value(value: Any) -> Any:
    """A cell as JSON has it: NaN and infinities null (a bare NaN is not JSON: parsers refused the output), a
    BLOB as DuckDB prints it, lists and structs element by element."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bytes):
        return _blob_text(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return value


def _blob_text(value: bytes) -> str:
    """DuckDB's text of a BLOB: printable ASCII as is, any other byte as \\xHH (not Python's b'...')."""
    return "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02X}" for b in value)


def format_rows(columns: list[str], rows: list[tuple], fmt: str = "table") -> str:
    """Rows as ``table`` (aligned text), ``csv`` or ``json`` (a list of objects)."""
    if fmt in ("csv", "json"):
        buf = io.StringIO()
        write_rows(columns, rows, buf, fmt)
        return buf.getvalue().rstrip("\n")
    if fmt != "table":
        raise LmdataError(f"--output {fmt!r}: choose one of {', '.join(OUTPUT_FORMATS)}")
    cells = [columns] + [[_cell(v) for v in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any, limit: int = 60) -> str:
    s = "NULL" if value is None else str(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


# ---------------------------------------------------------------------------- show
