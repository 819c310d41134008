"""The `lmdata` command: a thin click shell over library functions.

Each command group is one module of this package (``lmdata/cli/<group>.py``)
and is imported only when invoked, so ``lmdata --help`` does not pay for torch or
pyarrow. Errors of type ``LmdataError`` become one ``error: ...`` line and exit 1.
"""

from __future__ import annotations

import importlib
import sys

import click

from lmdata import __version__
from lmdata.errors import LmdataError

# command name -> "module:attribute" of the click command, and its one-line help.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("lmdata.cli.run:run_command", "Run a pipeline end to end: tokenizer, ingest, verify, train, sample, bench."),
    "tokenizer": ("lmdata.cli.tokenizer:tokenizer", "Train, import or export a BPE tokenizer; encode/decode text."),
    "ingest": ("lmdata.cli.ingest:ingest_command", "Tokenize raw text into a store (memmap, Parquet, Lance)."),
    "inspect": ("lmdata.cli.inspect:inspect_command", "Documents, tokens, shards, bytes and lengths of a store."),
    "sql": ("lmdata.cli.inspect:sql_command", "DuckDB SQL over a store's docs and tokens views."),
    "show": ("lmdata.cli.inspect:show_command", "Decode one document of a store back to text."),
    "verify": ("lmdata.cli.inspect:verify_command", "Check a store's checksums, counts and cross-format identity."),
    "bench": ("lmdata.cli.bench:bench", "Measure GPU stall time per storage format and worker count."),
    "plan": ("lmdata.cli.bench:plan", "Parameters, FLOPs/token, memory and tokens/s a model on a GPU needs."),
    "train": ("lmdata.cli.train:train", "Train the from-scratch Transformer LM on a store (checkpoints, resume, DDP)."),
    "sample": ("lmdata.cli.train:sample", "Generate text from a training checkpoint."),
    "export": ("lmdata.cli.train:export", "Export a training checkpoint (--to hf: a Hugging Face Llama directory)."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, attr = COMMANDS[name][0].split(":")
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lmdata")
def cli() -> None:
    """lmdata: raw text -> tokens -> memmap/Parquet/Lance shards -> a loader that keeps the GPU busy."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script: LmdataError -> one line on stderr, exit 1."""
    try:
        cli.main(args=argv, prog_name="lmdata", standalone_mode=False)
    except LmdataError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
