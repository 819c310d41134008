"""Storage formats by name: the built-ins, formats registered at run time, and plug-ins.

Adding a format is one module that calls ``register_format(name, Writer, Reader)``
(see ``protocol.py``). The built-ins (memmap, parquet, lance) are imported only when
first asked for, so naming a format does not import pyarrow or lance. Third parties
publish an entry point in the ``lmdata.formats`` group; its value is one of

* a module that calls ``register_format`` when imported,
* a callable taking no arguments that calls ``register_format``,
* a ``(Writer, Reader)`` pair, registered under the entry point's name.

    [project.entry-points."lmdata.formats"]
    zarr = "lmdata_zarr:register"
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from lmdata.errors import LmdataError
from lmdata.store.protocol import FormatReader, FormatWriter

ENTRY_POINT_GROUP = "lmdata.formats"

# name -> "module:WriterClass:ReaderClass" of the built-in formats, in default-read order.
_BUILTINS: dict[str, str] = {
    "memmap": "lmdata.store.formats.memmap:MemmapWriter:MemmapReader",
    "lance": "lmdata.store.formats.lance:LanceWriter:LanceReader",
    "parquet": "lmdata.store.formats.parquet:ParquetWriter:ParquetReader",
}
# What an ingest writes when no format is named, in the manifest's order (never plug-ins).
BUILTIN_FORMATS = ("memmap", "parquet", "lance")
assert set(BUILTIN_FORMATS) == set(_BUILTINS)


@dataclass(frozen=True)
class Format:
    """A registered format: its name, writer class and reader class."""

    name: str
    writer: type[FormatWriter] | Any
    reader: type[FormatReader] | Any


_registered: dict[str, Format] = {}
_entry_points_loaded = False


def register_format(name: str, writer: FormatWriter | Any, reader: FormatReader | Any, *,
                    replace: bool = False) -> None:
    """Make ``name`` a format: ``writer(format_dir, dtype)`` and ``reader(format_dir, shards, dtype)``.

    A name that is already a format (a built-in or one registered before) is refused unless
    ``replace=True``: a plug-in never silently takes over ``parquet``.
    """
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise LmdataError(f"format name {name!r} must be letters, digits, '-' or '_' (it is a directory name)")
    if not replace and (name in _BUILTINS or name in _registered):
        raise LmdataError(f"format {name!r} is already registered; pick another name, or pass replace=True "
                          "to register_format to replace it")
    _registered[name] = Format(name, writer, reader)


def unregister_format(name: str) -> None:
    """Forget a format registered at run time (tests use it to clean up)."""
    _registered.pop(name, None)


def available_formats() -> list[str]:
    """Every format name: built-ins first (memmap, lance, parquet), then the others."""
    _load_entry_points()
    return list(_BUILTINS) + sorted(n for n in _registered if n not in _BUILTINS)


def get_format(name: str) -> Format:
    """The format called ``name``; an error listing the valid names otherwise."""
    if name in _registered:
        return _registered[name]
    if name in _BUILTINS:
        module, writer, reader = _BUILTINS[name].split(":")
        mod = importlib.import_module(module)
        _registered.setdefault(name, Format(name, getattr(mod, writer), getattr(mod, reader)))
        return _registered[name]
    _load_entry_points()
    if name in _registered:
        return _registered[name]
    raise LmdataError(f"unknown format {name!r}; valid formats: {', '.join(available_formats())}")


def _load_entry_points() -> None:
    """Register the formats of installed plug-ins (once per process)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    try:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            _load_entry_point(ep)
    except LmdataError:
        _entry_points_loaded = False  # the next call raises again rather than going on without it
        raise


def _load_entry_point(ep: Any) -> None:
    """Load one ``lmdata.formats`` entry point: a module, a registering callable, or a pair."""
    try:
        obj = ep.load()
    except Exception as exc:
        raise LmdataError(f"format plug-in {ep.name!r} ({ep.value}) failed to load: {exc!r}") from exc
    if isinstance(obj, tuple) and len(obj) == 2:
        register_format(ep.name, *obj)
    elif callable(obj) and not isinstance(obj, type):
        obj()
    elif not isinstance(obj, ModuleType):  # a module registered its format(s) when imported
        raise LmdataError(
            f"format plug-in {ep.name!r} ({ep.value}) loaded to {type(obj).__name__} {obj!r:.60}; an "
            f"{ENTRY_POINT_GROUP} entry point must name a module that calls register_format, a callable "
            "taking no arguments that does, or a (Writer, Reader) pair; fix or uninstall the plug-in"
        )
