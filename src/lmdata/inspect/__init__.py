"""Look inside a store: statistics (``stats``, Polars), SQL (``sql``, DuckDB sandbox), ``show``."""

from __future__ import annotations

from lmdata._lazy import lazy_exports

_EXPORTS = {
    name: "lmdata.inspect.stats"
    for name in ("inspect", "format_inspect", "doc_table", "show", "sql", "write_sql", "connect",
                 "format_rows", "TABLE_LIMIT")
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
