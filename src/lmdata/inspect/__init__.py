"""Look inside a store: the per-document index (``tables``), statistics (``stats``, Polars),
SQL (``sandbox``: ``sql`` in the DuckDB sandbox) and ``document`` (``show``: a document as text;
module names differ from the functions so that importing one never shadows the other)."""

from __future__ import annotations

from lmdata._lazy import lazy_exports

_EXPORTS = {
    "inspect": "lmdata.inspect.stats", "format_inspect": "lmdata.inspect.stats",
    "doc_table": "lmdata.inspect.tables",
    "show": "lmdata.inspect.document",
    **{name: "lmdata.inspect.sandbox" for name in ("sql", "write_sql", "connect", "format_rows", "TABLE_LIMIT")},
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
