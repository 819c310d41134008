"""``lmdata inspect``: documents, tokens, shards, bytes and length percentiles per split and format (Polars)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lmdata.inspect.tables import doc_lengths, ingest_shard_docs
from lmdata.store.store import open_store

PERCENTILES = (0.5, 0.9, 0.99)


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
        lengths = pl.Series("n", doc_lengths(st, split))
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
            sizes = _disk_sizes(st.format_dir(split, fmt))
            disk = sum(sizes.values())
            entry["formats"][fmt] = {"shards": len(ingest_shard_docs(shards)) - 1, "fragments": len(shards),
                                     "bytes": disk, "bytes_per_token": round(disk / max(1, info.n_tokens), 3),
                                     "damaged": _size_problems(sizes, shards)}
        out["splits"][split] = entry
    return out


def _disk_sizes(path: Any) -> dict[str, int]:
    """Path under ``path`` -> bytes, of every file there (Lance's commit log and sidecars included; remote: one
    LIST)."""
    if path.remote:
        return {x.key: x.size for x in path.list(recursive=True)}
    root = os.fspath(path)
    sizes, todo = {}, [root] if os.path.isdir(path) else []
    while todo:  # scandir's entries: no path parsed per file (500,000 files: ~2 s of os.walk + lstat)
        with os.scandir(todo.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    todo.append(entry.path)
                else:
                    try:  # a link's target (readers follow links inside the store), a dangling one missing
                        sizes[entry.path[len(root) + 1:]] = entry.stat().st_size
                    except OSError:
                        pass
    return sizes


def _size_problems(sizes: dict[str, int], shards: list) -> list[str]:
    """The manifest's shard files that are missing or of another size (what a truncation or a deleted file
    leaves; the checksums are ``verify``'s), at most 3 named."""
    bad = [f"{f.path} is missing" if sizes.get(f.path) is None else
           f"{f.path} has {sizes[f.path]:,} bytes, the manifest says {f.bytes:,}"
           for s in shards for f in s.files if sizes.get(f.path) != f.bytes]
    return bad[:3] + ([f"{len(bad) - 3:,} more"] if len(bad) > 3 else [])


def damaged(report: dict[str, Any]) -> str | None:
    """One line naming the first damaged format of ``inspect``'s report, or None."""
    for split, s in report["splits"].items():
        for fmt, f in s["formats"].items():
            if f["damaged"]:
                return (f"{report['store']}: {split} {fmt}: {'; '.join(f['damaged'])}; the store is damaged, run "
                        "`lmdata verify` and re-ingest with --overwrite")
    return None


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
            lines.append(f"    {fmt:8s} {f['shards']:5d} {'shard ' if f['shards'] == 1 else 'shards'}{grouped:<17s} {f['bytes']:>14,} bytes  "
                         f"{f['bytes_per_token']:.3f} bytes/token")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- sql
