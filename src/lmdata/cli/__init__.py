"""The `lmdata` command: a thin click shell over library functions.

Each command group is one module of this package (``lmdata/cli/<group>.py``)
and is imported only when invoked, so ``lmdata --help`` does not pay for torch or
pyarrow. Errors of type ``LmdataError`` become one ``error: ...`` line and exit 1.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import click

from lmdata import __version__
from lmdata.io import atomic
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
    "batch": ("lmdata.cli.train:batch", "Which documents a training step's batch came from (recomputed, no log needed)."),
    "export": ("lmdata.cli.train:export", "Export a training checkpoint (--to hf: a Hugging Face Llama directory)."),
}

# what a rerun of an interrupted command does, for the one line a Ctrl-C prints
INTERRUPTED = {
    "ingest": ": rerun with --resume to continue from the completed shards",
    "train": ": rerun with --resume to continue from the last checkpoint",
    "run": ": rerun the same command to continue",
}


class Interrupted(click.ClickException):
    """Ctrl-C inside a command: its one line and exit 130 (click's own main prints a blank line first)."""

    exit_code = 130

    def __init__(self, hint: str = "") -> None:
        super().__init__(f"interrupted{hint}")


@contextlib.contextmanager
def resume_hint_only_if(resumable: Callable[[], bool]) -> Iterator[None]:
    """A Ctrl-C inside keeps the command's hint to resume only when ``resumable()`` (something was written)."""
    try:
        yield
    except KeyboardInterrupt:
        if not resumable():
            raise Interrupted() from None
        raise


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Interrupted(INTERRUPTED.get(ctx.invoked_subcommand or "", "")) from None

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


def _version_message() -> str:
    from lmdata.tokenizer.accelerator import accelerator_status

    return f"lmdata {__version__} (Python {sys.version.split()[0]}, {sys.platform}); {accelerator_status()}"


def _show_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_version_message())
        ctx.exit()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_version,
              help="Show the version, and whether the C tokenizer accelerator is in use.")
def cli() -> None:
    """lmdata: raw text -> tokens -> memmap/Parquet/Lance shards -> a loader that keeps the GPU busy."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script: LmdataError -> one line on stderr, exit 1; a warning ->
    one ``warning:`` line (``_warning_line``)."""
    shown_before, warnings.showwarning = warnings.showwarning, _warning_line
    try:
        cli.main(args=argv, prog_name="lmdata", standalone_mode=False)
    except LmdataError as exc:
        click.echo(f"error: {_one_line(str(exc))}", err=True)
        sys.exit(1)
    except OSError as exc:  # a library's I/O error no layer below turned into ours (pyarrow's are OSErrors)
        click.echo(f"error: {os_error_line(exc)}", err=True)
        sys.exit(1)
    except (KeyboardInterrupt, click.exceptions.Abort):
        # the one line of a Ctrl-C; the work is left resumable (ingest: --resume; train: the last checkpoint)
        argv = sys.argv[1:] if argv is None else argv
        click.echo(f"interrupted{INTERRUPTED.get(next((a for a in argv if a in COMMANDS), ''), '')}", err=True)
        sys.exit(130)
    except Interrupted as exc:
        click.echo(exc.message, err=True)
        sys.exit(exc.exit_code)
    except _NO_ARGS_IS_HELP as exc:  # bare ``lmdata`` or ``lmdata tokenizer``: the help, as click prints it
        exc.show()
        sys.exit(exc.exit_code)
    except click.UsageError as exc:  # one line, as every other error (click's own is usage, hint, blank, error)
        where = exc.ctx.command_path if exc.ctx is not None else "lmdata"
        click.echo(f"error: {_one_line(exc.format_message())} (see `{where} --help`)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    finally:
        warnings.showwarning = shown_before


# errno -> what to do about it, for an I/O error that reaches the top (the path comes first)
_FIXES = {
    errno.ENOSPC: "free space on that filesystem or write elsewhere",
    errno.EDQUOT: "free space within your quota or write elsewhere",
    errno.EACCES: "check the file's permissions",
    errno.EPERM: "check the file's permissions",
    errno.EROFS: "the filesystem is read-only: write elsewhere",
    errno.EMFILE: "raise the open-file limit (ulimit -n)",
    errno.ENOENT: "check the path",
    errno.EISDIR: "give a file, not a directory",
    errno.ENOTDIR: "give a directory, not a file",
    errno.EIO: "the device failed to read or write: check the disk",
}


def _warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int, file=None,
                  line: str | None = None) -> None:
    """A warning as the CLI prints it: one line on stderr. Python's own format adds the file and the
    source line that raised it (``tokens = self._ensure_copy(i)``), which tell a user nothing."""
    click.echo(f"warning: {_one_line(str(message))}", err=True)


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())  # a UsageError since click 8.2


def _one_line(text: str) -> str:
    """``text`` on one line (a library's message wrapped in ours may hold newlines); an S3 server's XML
    error document inside it becomes its <Code> (a truncated object's had made a ~900-character line)."""
    text = _XML_ERROR.sub(lambda m: f"[{m.group(1) or 'XML error body'}]", text)
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


_XML_ERROR = re.compile(r"<\?xml.*?(?:<Code>([^<]*)</Code>.*?)?</Error>", re.S)


def os_error_line(exc: OSError) -> str:
    """An ``OSError`` as one line naming the file (when the library said which) and the fix."""
    path = exc.filename if exc.filename is not None else None
    what = exc.strerror or str(exc)
    fix = _FIXES.get(exc.errno, "check the path and the disk")
    if atomic.is_no_space(exc):
        fix = _FIXES[errno.ENOSPC]
    return _one_line(f"{path}: {what}; {fix}" if path else f"{what}; {fix}")
