"""CLI command ``lmdata sql``: parses its flags and calls ``lmdata.inspect.write_sql``.

(``inspect``, ``show`` and ``verify`` still live in ``ingest_cli.py``.)
"""

from __future__ import annotations

import sys

import click


@click.command("sql")
@click.argument("store", type=click.Path())
@click.argument("query")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.option("--limit", type=int, default=None,
              help="At most N rows (0: all). Default: 1,000 for a table; csv and json stream every row.")
def sql_command(store: str, query: str, fmt: str, limit: int | None) -> None:
    """DuckDB SQL (one statement) over views docs(split, doc_id, shard, n_tokens, token_offset) and
    tokens(split, doc_id, token_offset, tokens)."""
    from lmdata.inspect import write_sql

    write_sql(store, query, sys.stdout, fmt, limit)
