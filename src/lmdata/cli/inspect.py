"""``lmdata inspect``, ``sql``, ``show``, ``verify``: thin shells over ``lmdata.inspect`` and
``lmdata.store.verify.verify_store``, each also callable from Python with the same arguments."""

from __future__ import annotations

import json
import sys

import click

from lmdata.cli.options import renamed, typed
from lmdata.errors import LmdataError


@click.command("sql")
@click.argument("store", type=click.Path())
@click.argument("query")
@click.option("--output", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
              help="How to print the result rows.")
@click.option("--format", "old_fmt", type=click.Choice(["table", "csv", "json"]), default=None, hidden=True,
              callback=renamed("format", "output"))
@click.option("--limit", type=int, default=None,
              help="At most N rows (0: all). Default: 1,000 for a table; csv and json stream every row.")
@click.pass_context
def sql_command(ctx: click.Context, store: str, query: str, fmt: str, old_fmt: str | None, limit: int | None) -> None:
    """DuckDB SQL (one statement) over views docs(split, doc_id, shard, n_tokens, token_offset,
    source, source_offset) and tokens(split, doc_id, token_offset, tokens)."""
    from lmdata.inspect import write_sql

    if old_fmt and typed(ctx, "fmt"):
        raise LmdataError("--output and its old name --format both given; keep --output")
    write_sql(store, query, sys.stdout, old_fmt or fmt, limit)


@click.command("inspect")
@click.argument("store", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
def inspect_command(store: str, as_json: bool) -> None:
    """Per split and format: documents, tokens, shards, bytes, document lengths, tokenizer."""
    from lmdata.inspect import format_inspect, inspect
    from lmdata.inspect.stats import damaged

    report = inspect(store)
    click.echo(json.dumps(report, indent=1) if as_json else format_inspect(report))
    if problem := damaged(report):  # the summary first (what is there), then the error and a non-zero exit
        raise LmdataError(problem)


@click.command("show")
@click.argument("store", type=click.Path())
@click.option("--split", default="train", show_default=True)
@click.option("--doc", type=int, required=True, help="Document id within the split.")
@click.option("--format", "fmt", help="Store format to read (memmap, parquet, lance, ...); default: the store's fastest.")
def show_command(store: str, split: str, doc: int, fmt: str | None) -> None:
    """Decode one document of a store back to text (where it came from goes to stderr)."""
    from lmdata.inspect import show
    from lmdata.inspect.document import source_line
    from lmdata.store import open_store

    st = open_store(store)  # once: a 100,000-shard manifest takes ~0.7 s to parse
    text = show(st, split, doc, fmt)
    click.echo(text, nl=not text.endswith("\n"))  # a document that ends a line is printed as it is
    click.echo(source_line(st, split, doc), err=True)


@click.command("verify")
@click.argument("store", type=click.Path())
def verify_command(store: str) -> None:
    """Checksums, counts against the manifest, identical token streams across formats."""
    from lmdata.store.verify import verify_store

    report = verify_store(store)
    if len(report.problems) > 1:  # every problem on stdout, one a line; the error line names the first
        for problem in report.problems:
            click.echo(f"{store}: {problem}")
    report.raise_if_bad()  # exit 1 naming the first bad shard
    click.echo(f"{store}: ok ({report.files:,} files, {report.bytes:,} bytes checked; every format holds the same tokens)")
