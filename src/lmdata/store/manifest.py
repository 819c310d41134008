"""The store's manifest: what a store holds, written last and atomically.

A store without ``manifest.json`` is not a store. The manifest is JSON (never pickle);
every file path in it is relative to its format directory and must resolve inside the
store (no ``..``, no absolute paths, no symlink escapes) -- ``resolve_inside`` enforces it.

Example (abridged)::

    {"format": "lmdata-store", "format_version": 1, "lmdata_version": "0.1.0",
     "tokenizer": {"hash": "3f2a...", "vocab_size": 8192, "dir": "tokenizer"},
     "dtype": "uint16", "eot_id": 8191, "shard_tokens": 1048576,
     "splits": {"train": {"n_docs": 61, "n_tokens": 212345,
         "sources": [{"path": "data/sample.txt", "bytes": 990581, "xxh128": "f265..."}],
         "formats": {"memmap": {"shards": [{"name": "00000", "n_docs": 61,
             "n_tokens": 212345, "first_doc": 0, "first_token": 0,
             "files": [{"path": "tokens-00000.bin", "bytes": 424690, "xxh128": "..."}]}]}}}}}
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISLNK
from typing import Any

from lmdata._gc_pause import no_gc_pass
from lmdata.errors import LmdataError
from lmdata.store.protocol import ShardInfo
from lmdata.store.schema import Each, Many, Text, _explain, _json_type, _matcher, check_schema  # noqa: F401 - re-exported

# 2: memmap shards carry block checksums (tokens-*.bin.crc); 3: files record xxh128, not sha256 (``digests.py``).
# Stores of versions 1 and 2 still read.
FORMAT_VERSION = 3
from lmdata.store.layout import MANIFEST_NAME, PLAN_NAME, PROVENANCE_DIR, TOKENIZER_DIR

STORE_FORMAT = "lmdata-store"  # the manifest's "format": what makes a directory an lmdata store
DTYPES = ("uint16", "uint32")
_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# the store's own entries beside the split directories (ingest-plan.json: see ``ingest_output``)
_RESERVED = frozenset({TOKENIZER_DIR, MANIFEST_NAME, PLAN_NAME})


def check_split_name(name: str, where: str) -> str:
    """``name`` if it is a valid split name, else an error naming ``where`` (a flag, key or file).

    A split name is a directory of the store (``<store>/<split>/<format>``): a letter or digit,
    then letters, digits, ``_``, ``.`` or ``-``, never ``..`` and never one of the store's own
    entries -- so it can neither leave the store nor overwrite its manifest or tokenizer.
    """
    if not isinstance(name, str) or not _SPLIT_NAME.fullmatch(name) or ".." in name or name in _RESERVED:
        raise LmdataError(
            f"{where}: split name {name!r} must be a letter or digit, then letters, digits, '_', '.' or '-' "
            f"(no '..', not {', '.join(sorted(_RESERVED))}): it names a directory inside the store"
        )
    return name


# ---------------------------------------------------------------------------- schema
# The spec language and its validator: ``schema.py``.

# a file records one checksum (``digests.py``): xxh128 in stores written since 2026-12-07, sha256 before
FILE_SPEC = {"path": Text(), "bytes": int, "xxh128?": Text(r"[0-9a-f]{32}"), "sha256?": Text(r"[0-9a-f]{64}")}
_MEMBER = {"name": Text(), "n_docs": int, "n_tokens": int, "rows?": int}
# the keys built-in formats record in a shard's ``extra`` (Parquet: rows, row_groups; Lance:
# rows, fragment, members, columns; token_bytes in stores of an earlier lmdata); a plug-in's own keys pass unchecked
_SHARD_EXTRA = {"rows?": int, "row_groups?": int, "token_bytes?": bool, "columns?": [str], "fragment?": dict,
                "members?": [_MEMBER]}
_SHARD = {"name": Text(), "n_docs": int, "n_tokens": int, "first_doc": int, "first_token": int,
          "files?": [FILE_SPEC], "extra?": _SHARD_EXTRA}
SHARDS = [_SHARD]  # a table's shards: checked when the table is first read (``ShardTable``)
_TABLE = {"shards": list}
_SPLIT = {"n_docs": int, "n_tokens": int, "sources?": [dict], "formats?": Each(_TABLE),
          "provenance?": _TABLE}  # store/provenance.py: each document's source
_SPLIT_EXTRA = {"text_bytes?": (int, type(None)), "replaced?": int}
SCHEMA = {
    "format?": Text(), "format_version": int, "lmdata_version?": str,
    "tokenizer": {"hash": Text(), "vocab_size": int, "dir?": str},
    "dtype": Text(), "eot_id": int, "shard_tokens": int,
    "splits": Each(_SPLIT), "extra?": {"splits?": Each(_SPLIT_EXTRA)},
}


_FORMAT_SHARDS: dict[str, tuple[Any, list[Any]]] = {}  # format -> (its MANIFEST_SHARD, SHARDS with it merged in)


def shards_spec(fmt: str | None) -> list[Any]:
    """``SHARDS`` with a format's own shard fields merged in (a reader's ``MANIFEST_SHARD``: how many
    files a shard has, the ``extra`` keys it reads; a format not installed here: ``SHARDS``). One pass
    checks both: two had checked every file entry twice (100,010 shards: ~0.5 s of the 1.6)."""
    from lmdata.store.registry import get_format

    try:
        own = getattr(get_format(fmt).reader, "MANIFEST_SHARD", None) if fmt is not None else None
    except LmdataError:
        own = None
    if own is None:
        return SHARDS
    known = _FORMAT_SHARDS.get(fmt)
    if known is None or known[0] is not own:
        spec = dict(_SHARD)
        for key, sub in own.items():  # the format's field replaces the general one (and merges into a dict)
            general = next((k for k in spec if k.rstrip("?") == key.rstrip("?")), None)
            if general is not None and isinstance(sub, dict) and isinstance(spec[general], dict):
                names = {k.rstrip("?") for k in sub}
                sub = {**{k: v for k, v in spec[general].items() if k.rstrip("?") not in names}, **sub}
            spec.pop(general, None)
            spec[key] = sub
        known = _FORMAT_SHARDS[fmt] = (own, [spec])
    return known[1]


_BUILD_LOCK = threading.Lock()
if hasattr(os, "register_at_fork"):  # a fork while another thread builds: the child's lock is free
    os.register_at_fork(after_in_child=lambda: globals().__setitem__("_BUILD_LOCK", threading.Lock()))


class ShardTable(Sequence):
    """A table's shards as the manifest records them (a format's, or provenance's), checked against the
    schema and made ``ShardInfo``s when the table is first read, not when the manifest is parsed.

    A reader reads one table: checking and building the others had been most of ``open_store``
    (11,761 shards in 3 formats and provenance: 0.25 s of its ~0.4 s checking every table). A bad
    field is the same one-line error, naming it, from whatever first reads the table."""

    __slots__ = ("_raw", "_where", "_field", "_fmt", "_shards")

    def __init__(self, raw: list[Any], where: str, field: str, fmt: str | None) -> None:
        self._raw, self._where, self._field, self._fmt = raw, where, field, fmt
        self._shards: list[ShardInfo] | None = None

    def _built(self) -> list[ShardInfo]:
        shards = self._shards
        if shards is None:
            with _BUILD_LOCK:  # two threads making readers of one store at once: one builds, both see it
                shards = self._shards
                if shards is None:
                    with no_gc_pass():
                        check_schema(self._raw, shards_spec(self._fmt), self._where, self._field)
                        try:
                            shards = self._shards = [ShardInfo.from_checked(sh) for sh in self._raw]
                        except KeyError as exc:  # the one thing the schema cannot say: a file with no checksum
                            raise LmdataError(f"{self._where}: {self._field}: a shard file records {exc.args[0]}; "
                                              "the manifest is corrupt, re-run the ingest with --overwrite") from None
                    self._raw = None  # (after _shards is set: ``__len__`` reads them in the other order)
        return shards

    def __len__(self) -> int:
        raw = self._raw
        return len(raw) if raw is not None else len(self._shards)  # type: ignore[arg-type]

    def __getitem__(self, i: Any) -> Any:
        return self._built()[i]

    def __iter__(self) -> Iterator[ShardInfo]:
        return iter(self._built())

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, ShardTable)) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return list, (self._built(),)

    def __repr__(self) -> str:
        return f"ShardTable({self._field}, {len(self)} shards)"


@dataclass
class SplitInfo:
    n_docs: int
    n_tokens: int
    sources: list[dict[str, Any]] = field(default_factory=list)
    formats: dict[str, list[ShardInfo]] = field(default_factory=dict)
    provenance: list[ShardInfo] | None = None  # each document's source (``store.provenance``); None: unknown


@dataclass
class Manifest:
    tokenizer_hash: str
    vocab_size: int
    dtype: str
    eot_id: int
    shard_tokens: int
    splits: dict[str, SplitInfo] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    lmdata_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STORE_FORMAT,
            "format_version": self.format_version,
            "lmdata_version": self.lmdata_version,
            "tokenizer": {"hash": self.tokenizer_hash, "vocab_size": self.vocab_size, "dir": "tokenizer"},
            "dtype": self.dtype,
            "eot_id": self.eot_id,
            "shard_tokens": self.shard_tokens,
            "splits": {
                name: {
                    "n_docs": s.n_docs,
                    "n_tokens": s.n_tokens,
                    "sources": s.sources,
                    "formats": {f: {"shards": [sh.to_json() for sh in shards]} for f, shards in s.formats.items()},
                    **({} if s.provenance is None else {"provenance": {"shards": [sh.to_json() for sh in s.provenance]}}),
                }
                for name, s in self.splits.items()
            },
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str = MANIFEST_NAME) -> "Manifest":
        """The manifest in ``obj``, after ``check_schema``: a bad field is an error naming it."""
        if not isinstance(obj, dict):
            raise LmdataError(f"{where}: the manifest is {_json_type(obj)}, not an object; re-run the ingest "
                              "with --overwrite")
        if obj.get("format", STORE_FORMAT) != STORE_FORMAT:  # absent in manifests written before it
            raise LmdataError(f"{where}: not an lmdata store manifest (format {obj.get('format')!r}, "
                              f"expected {STORE_FORMAT!r})")
        check_schema({"format_version": obj.get("format_version")}, {"format_version": int}, where)
        version = obj["format_version"]
        if version > FORMAT_VERSION:  # before the schema: a newer version may have another one
            raise LmdataError(
                f"{where}: store format version {version} is newer than this lmdata supports "
                f"({FORMAT_VERSION}); upgrade lmdata to read it"
            )
        check_schema(obj, SCHEMA, where)  # each table's shards: when it is first read (``ShardTable``)
        try:
            dtype = str(obj["dtype"])
            if dtype not in DTYPES:
                raise LmdataError(f"{where}: dtype {dtype!r} is not one of {', '.join(DTYPES)}; the manifest is "
                                  "corrupt, re-run the ingest with --overwrite")
            splits = {
                check_split_name(name, where): SplitInfo(
                    n_docs=int(s["n_docs"]),
                    n_tokens=int(s["n_tokens"]),
                    sources=list(s.get("sources", [])),
                    formats={
                        f: ShardTable(entry["shards"], where, f"splits.{name}.formats.{f}.shards", f)
                        for f, entry in s.get("formats", {}).items()
                    },
                    provenance=(ShardTable(s["provenance"]["shards"], where, f"splits.{name}.provenance.shards", None)
                                if "provenance" in s else None),
                )
                for name, s in obj["splits"].items()
            }
            return cls(
                tokenizer_hash=str(obj["tokenizer"]["hash"]),
                vocab_size=int(obj["tokenizer"]["vocab_size"]),
                dtype=dtype,
                eot_id=int(obj["eot_id"]),
                shard_tokens=int(obj["shard_tokens"]),
                splits=splits,
                format_version=version,
                lmdata_version=str(obj.get("lmdata_version", "")),
                extra=dict(obj.get("extra", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise LmdataError(f"{where}: malformed manifest ({exc!r}); re-run the ingest with --overwrite") from exc


def write_manifest(store: Any, manifest: Manifest) -> None:
    """Write ``<store>/manifest.json`` atomically (the last step of an ingest): local tmp + fsync + rename, or one PUT."""
    from lmdata.io.location import location

    data = json.dumps(manifest.to_json(), indent=1, sort_keys=False).encode() + b"\n"
    (location(store) / MANIFEST_NAME).write_bytes(data)


def read_manifest(store: Any, *, check_paths: bool = True) -> Manifest:
    """Read and validate ``<store>/manifest.json`` (local or ``s3://``: one GET); a clear error if it is not a store.

    ``check_paths=False``: the caller checks that every file path stays inside the store itself
    (``open_store``: each table's recorded paths when it is first read, ``refuse_escaping_names``, and
    a symlink where a reader first opens its file)."""
    from lmdata.io.location import location

    loc = location(store, flag="store")
    manifest_loc = loc / MANIFEST_NAME
    try:
        raw = manifest_loc.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
        if isinstance(exc, IsADirectoryError):  # (it had been called an interrupted ingest, or no manifest)
            raise LmdataError(f"{manifest_loc}: is a directory, not the store's manifest; the store is damaged "
                              "(re-ingest with --overwrite)") from None
        loc.check_bucket()
        if not loc.remote and not loc.exists():
            raise LmdataError(f"{loc}: no such store directory; create one with `lmdata ingest`") from None
        if (loc / PLAN_NAME).exists():  # only an interrupted ingest's folder has one: then --resume helps
            raise LmdataError(f"{loc}: not a store yet, an interrupted ingest ({PLAN_NAME}, no {MANIFEST_NAME}); "
                              "finish it with `lmdata ingest ... --resume` (the same flags) before reading it") from None
        if loc.name == MANIFEST_NAME:  # the manifest itself given: its directory is the store
            raise LmdataError(f"{loc}: give the store directory that holds {MANIFEST_NAME}, not the file") from None
        raise LmdataError(f"{loc}: not a store (no {MANIFEST_NAME}); give a store directory `lmdata ingest` "
                          "wrote") from None
    with no_gc_pass():
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LmdataError(f"{manifest_loc}: not valid JSON ({exc}); re-run the ingest with --overwrite") from exc
        manifest = Manifest.from_json(obj, where=str(manifest_loc))
    if check_paths:
        for split, info in manifest.splits.items():
            for table, shards in tables(info).items():
                check_table_paths(loc, split, table, shards)
    return manifest


def tables(info: SplitInfo) -> dict[str, list[ShardInfo]]:
    """A split's tables of shards: each format's, and its provenance's (when it has one)."""
    return {**info.formats, **({PROVENANCE_DIR: info.provenance} if info.provenance is not None else {})}


def refuse_escaping_names(loc: Any, tables_of: dict[str, dict[str, list[ShardInfo]]]) -> None:
    """No recorded path is absolute or climbs out with ``..`` (by its text alone: a symlink is checked
    where a reader first opens the file: ``checksum.open_shard_file``, ``shard_file_path``). ``{split: {table: shards}}``."""
    for by_table in tables_of.values():
        for shards in by_table.values():
            for shard in shards:
                for f in shard.files:
                    if not plain_name(f.path):
                        _refuse_escape(loc, f.path)


def check_table_paths(loc: Any, split: str, table: str, shards: list[ShardInfo]) -> None:
    """Every file of ``shards`` (``<store>/<split>/<table>``) stays inside the store, else an error naming it."""
    names = [f.path for shard in shards for f in shard.files]
    if loc.remote:  # no symlinks on object storage: the relative path is the check
        for name in names:
            _refuse_escape(loc, name)
    else:
        _check_inside(loc.local_path, loc.local_path / split / table, names)


def _check_inside(store: Path, base: Path, names: list[str]) -> None:
    """``resolve_inside`` for every name, with one ``realpath`` per directory instead of one per file:
    a plain name that is no symlink, in a directory inside the store, is inside it (~2 us a file,
    against ~0.1 ms: a 1,000-shard store opened 0.6 s faster)."""
    base_s = os.fspath(base)
    inside = not os.path.exists(base_s) or format_dir_inside(base)
    for name in names:
        if inside and plain_name(name):
            try:
                if not S_ISLNK(os.lstat(os.path.join(base_s, name)).st_mode):
                    continue
            except FileNotFoundError:
                continue  # a missing file is the readers' error, with its shard named
        resolve_inside(store, base, name)


def plain_name(name: str) -> bool:
    """A file name with no directory part (inside its directory unless it is a symlink)."""
    return "/" not in name and name not in ("", ".", "..")


def format_dir_inside(format_dir: Path | str) -> bool:
    """Whether ``<store>/<split>/<format>`` resolves inside its store (one ``realpath`` each)."""
    format_dir = Path(format_dir)
    return format_dir.parent.parent.resolve() in format_dir.resolve().parents


def _refuse_escape(store: Any, relpath: str) -> None:
    if os.path.isabs(relpath) or ".." in Path(relpath).parts:
        raise LmdataError(f"{store}/{MANIFEST_NAME}: path {relpath!r} escapes the store; the manifest is corrupt")


def resolve_inside(store: Path, base: Path, relpath: str) -> Path:
    """``base / relpath``, refusing absolute paths, ``..`` and symlinks that leave ``store``."""
    _refuse_escape(store, relpath)
    full = (base / relpath)
    root = Path(store).resolve()
    if full.exists() or full.is_symlink():
        real = full.resolve()
        if root != real and root not in real.parents:
            raise LmdataError(f"{full}: resolves outside the store ({real}); refusing to read it")
    return full
