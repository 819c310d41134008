"""Click options derived from a config dataclass: one flag per field, its help and default.

``config_options(Cls)`` adds ``--batch-size`` for ``batch_size`` (booleans as
``--x/--no-x``, lists as comma-separated values, ``choices`` metadata as a click Choice).
``given(ctx, values)`` keeps only the flags typed on the command line, so a flag
overrides a PIPELINE.toml value while an untyped flag's default never does. A field with
``cli`` metadata ("module:function") is a repeatable flag, each value parsed by that function.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from lmdata.config import flag
from lmdata.errors import LmdataError
from lmdata.io.location import local_dir


class LocalOut(click.ParamType):
    """A local output path: ``file:///ABS`` is ``/ABS``; ``s3://`` or ``s3:/x`` is one line, not a local tree."""

    name = "path"

    def __init__(self, what: str) -> None:
        self.what = what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        flag_name = param.opts[0] if param is not None and param.opts else "--out"
        return value if isinstance(value, Path) else local_dir(value, flag=flag_name, what=self.what)


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag", flag(f.name))


WAS = "__was"  # the destination suffix of a renamed field's old flag (``was`` metadata)


def _option(f: dataclasses.Field, hint: Any, was: bool = False) -> Callable:
    """The field's flag; ``was``: its old name's, hidden, warning when typed (``renamed``)."""
    name, dest = (f.metadata["was"], f.name + WAS) if was else (_flag(f), f.name)
    option = partial(click.option, hidden=True, callback=renamed(name, _flag(f))) if was else click.option
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    help = f.metadata["help"]
    if "cli" in f.metadata:  # a repeatable flag with its own parser (``--mix A=0.7 --mix B=0.3``)
        return option(f"--{name}", dest, multiple=True, metavar=f.metadata.get("metavar"), help=help)
    if isinstance(default, bool):
        # an off-by-default switch shows no "[default: no-x]"
        return option(f"--{name}/--no-{name}", dest, default=default, show_default=default, help=help)
    if typing.get_origin(hint) is list:  # comma-separated, and repeatable: --format memmap --format lance adds up
        shown = ",".join(map(str, default)) or "all"
        kind = click.Choice(f.metadata["choices"]) if "choices" in f.metadata else None
        return option(f"--{name}", dest, default=[shown], show_default=shown, multiple=True,
                      help=f"{help} Repeatable (the values add up).", type=kind)
    kind = float if "float" in str(hint) else type(default) if default is not None else str
    choice = click.Choice(f.metadata["choices"]) if "choices" in f.metadata else kind
    return option(f"--{name}", dest, type=choice, default=default, show_default=default not in (None, ""), help=help)


def renamed(old: str, new: str) -> Callable:
    """The callback of a renamed flag's old name, kept for a release: one warning line when it is typed."""
    def warn(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if param.name and ctx.get_parameter_source(param.name) is not ParameterSource.DEFAULT:
            click.echo(f"warning: --{old} is deprecated (it goes in a later release); use --{new}", err=True)
        return value

    return warn


def typed(ctx: click.Context, name: str) -> bool:
    """Whether parameter ``name`` was given (on the command line or in the environment), not defaulted."""
    return ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)


def progress_options(fn: Callable | None = None, *, progress: bool = True) -> Callable:
    """``--progress/--no-progress`` (omitted with ``progress=False``: the config has the field) and ``--quiet``.

    Progress goes to stderr: a bar on a terminal, a plain line every few seconds in a pipe or
    file. ``--quiet`` prints only the command's summary (and errors).
    """
    def decorate(fn: Callable) -> Callable:
        fn = click.option("--quiet", "-q", is_flag=True, help="Print only the summary: no progress, no log lines.")(fn)
        if progress:
            fn = click.option("--progress/--no-progress", default=True,
                              help="Progress on stderr: a bar on a terminal, a line every few seconds in a log.")(fn)
        return fn

    return decorate(fn) if fn is not None else decorate


def echo_unless(quiet: bool, err: bool = False) -> Callable[[str], None]:
    """The log function of a command: ``click.echo``, or nothing under ``--quiet``."""
    return (lambda line: None) if quiet else (lambda line: click.echo(line, err=err))


def config_options(cls: type, skip: tuple[str, ...] = ()) -> Callable:
    """A decorator adding one click option per field of ``cls`` (except ``skip``)."""
    hints = typing.get_type_hints(cls)

    def decorate(fn: Callable) -> Callable:
        for f in reversed(dataclasses.fields(cls)):
            if f.name not in skip:
                fn = _option(f, hints[f.name])(fn)
                if "was" in f.metadata:
                    fn = _option(f, hints[f.name], was=True)(fn)
        return fn

    return decorate


def untyped(ctx: click.Context, keys: dict[str, str]) -> dict[str, str]:
    """``keys`` (flag -> the pipeline file's key) less the flags typed on this command line: with a
    PIPELINE.toml and flags mixed, an error about a typed flag names the flag, one about a value the
    file gave names its key (``pipeline.in_toml_terms``)."""
    params = {p.name: p for p in ctx.command.params if p.name}
    given_names = {name for name in params if typed(ctx, name)}
    given_names |= {name[:-len(WAS)] for name in given_names if name.endswith(WAS)}  # an old name: the new flag's value
    typed_opts = {opt for name in given_names if name in params
                  for opt in (*params[name].opts, *params[name].secondary_opts)}
    return {k: v for k, v in keys.items() if k not in typed_opts}


def given(ctx: click.Context, cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """The flags of ``cls`` typed on the command line, converted to the fields' types."""
    from lmdata.config import resolve

    hints = typing.get_type_hints(cls)
    parsers = {f.name: f.metadata["cli"] for f in dataclasses.fields(cls) if "cli" in f.metadata}
    out = {}
    values = dict(values)
    for old in [name for name in values if name.endswith(WAS)]:  # a renamed flag typed by its old name
        name, value = old[:-len(WAS)], values.pop(old)
        if typed(ctx, old):
            if typed(ctx, name):
                raise LmdataError(f"--{flag(name, cls)} and its old name --{_field_of(cls, name).metadata['was']} "
                                  "both given; keep --" + flag(name, cls))
            values[name] = value
    for name, value in values.items():
        if name not in hints or not (typed(ctx, name) or typed(ctx, name + WAS)):
            continue
        if name in parsers:
            out[name] = [resolve(parsers[name])(v) for v in value] or None
        else:
            is_list = typing.get_origin(hints[name]) is list
            out[name] = _list(",".join(value), hints[name], flag(name, cls)) if is_list else value
    return out


def _field_of(cls: type, name: str) -> dataclasses.Field:
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def _list(value: str, hint: Any, name: str) -> list:  # name: the flag, e.g. loader-workers
    """A comma-separated flag value as the field's list (``all`` = empty: every one)."""
    items = [v.strip() for v in value.split(",") if v.strip() and v.strip() != "all"]
    if typing.get_args(hint) == (int,):
        try:
            return [int(v) for v in items]
        except ValueError:
            raise LmdataError(f"--{name} {value!r}: give comma-separated integers, e.g. 0,1,2") from None
    return items
