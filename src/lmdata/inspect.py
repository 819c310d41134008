"""Look inside a store: statistics (Polars), SQL (DuckDB), and documents decoded to text.

``sql`` gives DuckDB two views, both read through Arrow by this process, so DuckDB itself
never opens a file:

    docs(split, doc_id, shard, n_tokens, token_offset)   every store; from memmap's
        docs-*.npy, else from the Parquet/Lance rows (one row per document, eot included)
    tokens(split, doc_id, tokens)   rows of the Parquet shards (a pyarrow dataset: DuckDB
        pushes WHERE down to it) or, without Parquet, of the Lance dataset (a fresh
        scanner per scan, filtered by DuckDB); a long document spans several rows of
        <= 1,024 tokens, in order of ``token_offset`` (also a column)
    tokens_parquet, tokens_lance    the same, per format, where present

After the views exist, ``enable_external_access`` is switched off and the configuration
locked: the user's SQL (run as given, never spliced into other SQL) can neither read nor
write any file -- not even inside the store, where ``read_parquet`` would have needed
``allowed_directories`` and so let ``COPY ... TO`` overwrite a shard.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import LmdataError
from lmdata.store.checksum import shard_file_path
from lmdata.store.manifest import Manifest, read_manifest

PERCENTILES = (0.5, 0.9, 0.99)
OUTPUT_FORMATS = ("table", "csv", "json")


# ---------------------------------------------------------------------------- per-document table


def doc_table(store: Path, manifest: Manifest, split: str) -> Any:
    """Arrow table docs(split, doc_id, shard, n_tokens, token_offset) of one split."""
    import pyarrow as pa

    info = manifest.splits[split]
    if "memmap" in info.formats:
        lengths, offsets = _memmap_docs(store / split / "memmap", info.formats["memmap"])
    elif info.formats:
        fmt = "parquet" if "parquet" in info.formats else next(iter(info.formats))
        lengths, offsets = _row_docs(_row_batches(store, manifest, split, fmt))
    else:
        lengths = offsets = np.zeros(0, dtype=np.int64)
    shards = next(iter(info.formats.values()), [])
    bounds = np.array([s.first_doc for s in shards[1:]], dtype=np.int64)
    doc_id = np.arange(len(lengths), dtype=np.int64)
    return pa.table({
        "split": pa.array([split] * len(lengths), pa.string()),
        "doc_id": doc_id,
        "shard": np.searchsorted(bounds, doc_id, side="right").astype(np.int64),
        "n_tokens": lengths,
        "token_offset": offsets,
    })


def _memmap_docs(format_dir: Path, shards: list) -> tuple[np.ndarray, np.ndarray]:
    lengths, offsets = [], []
    for shard in shards:
        starts = np.load(shard_file_path(format_dir, shard, shard.files[1]), allow_pickle=False)
        lengths.append(np.diff(starts))
        offsets.append(starts[:-1] + shard.first_token)
    if not lengths:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(lengths).astype(np.int64), np.concatenate(offsets).astype(np.int64)


def _row_docs(batches: Any) -> tuple[np.ndarray, np.ndarray]:
    """Rows (pieces of documents, in stream order) -> per-document lengths and offsets.

    Batch by batch, keeping three int64 per row (a row is <= 1,024 tokens), never the tokens.
    """
    import pyarrow.compute as pc

    ids, offs, lens = [], [], []
    for b in batches:
        ids.append(b.column("doc_id").to_numpy())
        offs.append(b.column("token_offset").to_numpy())
        lens.append(pc.list_value_length(b.column("tokens")).to_numpy().astype(np.int64))
    if not ids:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    doc_id, offset, n = np.concatenate(ids), np.concatenate(offs), np.concatenate(lens)
    first = np.flatnonzero(np.r_[True, doc_id[1:] != doc_id[:-1]])
    return np.add.reduceat(n, first), offset[first]


def _parquet_files(store: Path, manifest: Manifest, split: str) -> list[str]:
    fdir = store / split / "parquet"
    return [str(shard_file_path(fdir, s, f)) for s in manifest.splits[split].formats["parquet"] for f in s.files
            if f.path.endswith(".parquet")]


def _row_batches(store: Path, manifest: Manifest, split: str, fmt: str) -> Any:
    """Record batches of (doc_id, token_offset, tokens) in stream order, from Parquet or Lance."""
    columns = ["doc_id", "token_offset", "tokens"]
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return (b for f in _parquet_files(store, manifest, split) for b in pq.ParquetFile(f).iter_batches(columns=columns))
    import lance

    return lance.dataset(str(store / split / fmt)).to_batches(columns=columns, scan_in_order=True)


# ---------------------------------------------------------------------------- inspect


def inspect(store: str | Path) -> dict[str, Any]:
    """Per split and format: documents, tokens, shards, bytes on disk, bytes/token, doc lengths."""
    import polars as pl

    store = Path(store)
    manifest = read_manifest(store)
    extra = manifest.extra.get("splits", {})
    out: dict[str, Any] = {
        "store": str(store),
        "tokenizer": {"hash": manifest.tokenizer_hash, "vocab_size": manifest.vocab_size,
                      "eot_id": manifest.eot_id, "dtype": manifest.dtype},
        "splits": {},
    }
    for split, info in manifest.splits.items():
        lengths = pl.Series("n", doc_table(store, manifest, split).column("n_tokens").to_numpy())
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
            disk = _disk_bytes(store / split / fmt)
            entry["formats"][fmt] = {"shards": len(shards), "bytes": disk,
                                     "bytes_per_token": round(disk / max(1, info.n_tokens), 3)}
        out["splits"][split] = entry
    return out


def _disk_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (Lance's commit log and sidecars included)."""
    return sum(os.lstat(os.path.join(root, f)).st_size for root, _, names in os.walk(path) for f in names)


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
            lines.append(f"    {fmt:8s} {f['shards']:5d} shards {f['bytes']:>14,} bytes  {f['bytes_per_token']:.3f} bytes/token")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- sql


class _LanceRows:
    """An Arrow stream DuckDB can scan any number of times: a fresh Lance scanner each time."""

    def __init__(self, path: Path, split: str) -> None:
        self.path, self.split = path, split
        self._ds: Any = None

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        import lance
        import pyarrow as pa

        if self._ds is None:
            self._ds = lance.dataset(str(self.path))
        scanner = self._ds.scanner(columns=["doc_id", "token_offset", "tokens"])
        reader = scanner.to_reader()
        split_col = pa.array([self.split], pa.string())

        def batches() -> Any:
            for b in reader:
                yield pa.RecordBatch.from_arrays(
                    [pa.repeat(split_col[0], b.num_rows) if b.num_rows else pa.array([], pa.string()), *b.columns],
                    names=["split", *b.schema.names])

        schema = pa.schema([("split", pa.string()), *reader.schema])
        return pa.RecordBatchReader.from_batches(schema, batches()).__arrow_c_stream__(requested_schema)


def connect(store: str | Path) -> Any:
    """A DuckDB connection with the store's views, then locked away from every file."""
    import duckdb
    import pyarrow as pa
    import pyarrow.dataset as pads

    store = Path(store)
    manifest = read_manifest(store)
    con = duckdb.connect(":memory:")
    docs = [doc_table(store, manifest, split) for split in manifest.splits]
    con.register("_docs", pa.concat_tables(docs) if docs else pa.table({"split": pa.array([], pa.string())}))
    con.execute("CREATE VIEW docs AS SELECT * FROM _docs")
    per_format: dict[str, list[str]] = {"parquet": [], "lance": []}
    for i, (split, info) in enumerate(manifest.splits.items()):
        if "parquet" in info.formats:
            ds = pads.dataset(_parquet_files(store, manifest, split), format="parquet")
            con.register(f"_parquet_{i}", ds)
            per_format["parquet"].append(f"SELECT '{i}' AS _s, doc_id, token_offset, tokens FROM _parquet_{i}")
        if "lance" in info.formats:
            con.register(f"_lance_{i}", _LanceRows(store / split / "lance", split))
            per_format["lance"].append(f"SELECT '{i}' AS _s, doc_id, token_offset, tokens FROM _lance_{i}")
    names = list(manifest.splits)
    con.register("_split_names", pa.table({"_s": [str(i) for i in range(len(names))], "split": names}))
    for fmt, parts in per_format.items():
        if parts:  # split names come in through a joined table, never through SQL text
            con.execute(f"CREATE VIEW tokens_{fmt} AS SELECT n.split, r.doc_id, r.token_offset, r.tokens "
                        f"FROM ({' UNION ALL '.join(parts)}) r JOIN _split_names n USING (_s)")
    if per_format["parquet"] or per_format["lance"]:
        src = "tokens_parquet" if per_format["parquet"] else "tokens_lance"
        con.execute(f"CREATE VIEW tokens AS SELECT * FROM {src}")
    con.execute("SET autoinstall_known_extensions=false")
    con.execute("SET autoload_known_extensions=false")
    con.execute("SET enable_external_access=false")
    con.execute("SET lock_configuration=true")
    return con


def sql(store: str | Path, query: str) -> tuple[list[str], list[tuple]]:
    """Run the user's ``query`` (as given) against the store's views: (column names, rows)."""
    import duckdb

    con = connect(store)
    try:
        cur = con.execute(query)
        if cur.description is None:
            return [], []
        return [d[0] for d in cur.description], cur.fetchall()
    except duckdb.Error as exc:
        raise LmdataError(f"sql: {str(exc).splitlines()[0]}") from None
    finally:
        con.close()


def format_rows(columns: list[str], rows: list[tuple], fmt: str = "table") -> str:
    """Rows as ``table`` (aligned text), ``csv`` or ``json`` (a list of objects)."""
    if fmt == "json":
        return json.dumps([dict(zip(columns, r)) for r in rows], default=str)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        w.writerows(rows)
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
    from lmdata.store import open_store

    st = open_store(store)
    ids = st.document(split, doc, format)
    if len(ids) and int(ids[-1]) == st.eot_id:
        ids = ids[:-1]
    return st.tokenizer().decode([int(i) for i in ids])
