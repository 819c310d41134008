"""The store's manifest: what a store holds, written last and atomically.

A store without ``manifest.json`` is not a store. The manifest is JSON (never pickle);
every file path in it is relative to its format directory and must resolve inside the
store (no ``..``, no absolute paths, no symlink escapes) -- ``resolve_inside`` enforces it.

Example (abridged)::

    {"format": "lmdata-store", "format_version": 1, "lmdata_version": "0.1.0",
     "tokenizer": {"hash": "3f2a...", "vocab_size": 8192, "dir": "tokenizer"},
     "dtype": "uint16", "eot_id": 8191, "shard_tokens": 1048576,
     "splits": {"train": {"n_docs": 61, "n_tokens": 212345,
         "sources": [{"path": "data/sample.txt", "bytes": 990581, "sha256": "f265..."}],
         "formats": {"memmap": {"shards": [{"name": "00000", "n_docs": 61,
             "n_tokens": 212345, "first_doc": 0, "first_token": 0,
             "files": [{"path": "tokens-00000.bin", "bytes": 424690, "sha256": "..."}]}]}}}}}
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISLNK
from typing import Any, Callable

from lmdata._gc_pause import no_gc_pass
from lmdata.errors import LmdataError
from lmdata.store.protocol import ShardInfo

FORMAT_VERSION = 2  # 2: memmap shards carry block checksums (tokens-*.bin.crc); version 1 stores still read
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
# One validator for every manifest field, run before any field is used: a wrong type or an
# impossible value is one LmdataError naming the field's path (``splits.train.formats.memmap
# .shards[3].files[0].path``), never a TypeError/ValueError deep in a reader, inspect or SQL.
# A spec is a Python type for a leaf (``int`` means a JSON integer in [0, 2**62): bool and
# float are refused, and no count or offset is negative or overflows int64 arithmetic), a
# ``dict`` of field specs (keys ending in ``?`` are optional; unknown keys are kept, for
# fields a later version adds), a ``[spec]`` for a list, and ``Each(spec)`` for a mapping
# of user-chosen keys (split and format names) to values of one spec.

_MAX_INT = 1 << 62


@dataclass(frozen=True)
class Each:
    """A JSON object whose keys are names (splits, formats) and whose values all match ``spec``."""

    spec: Any


@dataclass(frozen=True)
class Many:
    """A list of at least ``at_least`` items, each matching ``spec`` (``[spec]`` is ``Many(spec)``)."""

    spec: Any
    at_least: int = 0


@dataclass(frozen=True)
class Text:
    """A string matching ``pattern`` (by default any non-empty one)."""

    pattern: str = r".+"


FILE_SPEC = {"path": Text(), "bytes": int, "sha256": Text(r"[0-9a-f]{64}")}
_MEMBER = {"name": Text(), "n_docs": int, "n_tokens": int, "rows?": int}
# the keys built-in formats record in a shard's ``extra`` (Parquet: rows, row_groups; Lance:
# rows, fragment, members, columns; token_bytes in stores of an earlier lmdata); a plug-in's own keys pass unchecked
_SHARD_EXTRA = {"rows?": int, "row_groups?": int, "token_bytes?": bool, "columns?": [str], "fragment?": dict,
                "members?": [_MEMBER]}
_SHARD = {"name": Text(), "n_docs": int, "n_tokens": int, "first_doc": int, "first_token": int,
          "files?": [FILE_SPEC], "extra?": _SHARD_EXTRA}
_SPLIT = {"n_docs": int, "n_tokens": int, "sources?": [dict], "formats?": Each({"shards": [_SHARD]}),
          "provenance?": {"shards": [_SHARD]}}  # store/provenance.py: each document's source
_SPLIT_EXTRA = {"text_bytes?": (int, type(None)), "replaced?": int}
SCHEMA = {
    "format?": Text(), "format_version": int, "lmdata_version?": str,
    "tokenizer": {"hash": Text(), "vocab_size": int, "dir?": str},
    "dtype": Text(), "eot_id": int, "shard_tokens": int,
    "splits": Each(_SPLIT), "extra?": {"splits?": Each(_SPLIT_EXTRA)},
}


def check_format_fields(obj: dict[str, Any], where: str) -> None:
    """Each format's own shard fields (a reader's ``MANIFEST_SHARD`` spec: how many files a shard
    has, the ``extra`` keys it reads), after ``SCHEMA``; a format not installed here is skipped."""
    from lmdata.store.registry import get_format

    for split, info in obj["splits"].items():
        for fmt, entry in info.get("formats", {}).items():
            try:
                spec = getattr(get_format(fmt).reader, "MANIFEST_SHARD", None)
            except LmdataError:
                continue
            if spec is not None:
                check_schema(entry["shards"], [spec], where, f"splits.{split}.formats.{fmt}.shards")


def _json_type(value: Any) -> str:
    return {type(None): "null", bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def _leaf_problem(value: Any, spec: Any) -> str | None:
    """Why ``value`` does not match the leaf ``spec`` (None when it does)."""
    if isinstance(spec, tuple):
        problems = [_leaf_problem(value, s) for s in spec]
        return None if None in problems else problems[0]
    if isinstance(spec, Text):
        if not isinstance(value, str):
            return f"is {_json_type(value)}, expected a string"
        return None if re.fullmatch(spec.pattern, value) else f"is {value[:40]!r}, expected a string matching {spec.pattern}"
    if spec is int:
        if type(value) is not int:
            return f"is {_json_type(value)} ({json.dumps(value)[:40]}), expected an integer"
        return None if 0 <= value < _MAX_INT else f"is {value}, expected an integer in [0, 2**62)"
    names = {str: "a string", bool: "a boolean", dict: "an object", list: "a list", type(None): "null"}
    return None if type(value) is spec else f"is {_json_type(value)}, expected {names.get(spec, spec.__name__)}"


def _matcher(spec: Any) -> Callable[[Any], bool]:
    """``spec`` compiled to one Python function that only says whether a value matches: straight-line
    checks and ``for`` loops, no field paths, no messages (``check_schema`` re-walks with those only
    when it says no). A closure per node had cost 0.45 of an 11,761-shard manifest's 1.3 s
    ``from_json`` (a call per field of every shard); the walk that built a path string per value,
    before that, 0.11 of a 1,160-shard manifest's 0.18 s."""
    lines: list[str] = ["def match(v0):"]
    consts: dict[str, Any] = {"_MISSING": _MISSING, "_MAX_INT": _MAX_INT, "_leaf_problem": _leaf_problem}
    _emit(spec, "v0", 1, lines, consts, [0])
    lines.append("    return True")
    exec(compile("\n".join(lines), "<manifest schema>", "exec"), consts)  # noqa: S102 - our own specs only
    return consts["match"]


_MISSING = object()
# Text patterns as plain string tests, each equal to ``re.fullmatch(pattern, s)`` (``.`` is any character but
# a newline): 0.1 s of an 11,761-shard manifest's ~250,000 names, paths and sha256s.
_PLAIN_TESTS = {r".+": '{0} and "\\n" not in {0}', r"[0-9a-f]{64}": 'len({0}) == 64 and not {0}.strip("0123456789abcdef")'}


def _emit(spec: Any, var: str, depth: int, lines: list[str], consts: dict[str, Any], names: list[int]) -> None:
    """Lines that ``return False`` unless ``var`` matches ``spec`` (``names``: a counter for fresh names)."""
    pad = "    " * depth

    def fresh(prefix: str) -> str:
        names[0] += 1
        return f"{prefix}{names[0]}"

    if isinstance(spec, dict):
        lines.append(f"{pad}if not isinstance({var}, dict): return False")
        for key, sub in spec.items():
            name, optional, item = key.rstrip("?"), key.endswith("?"), fresh("v")
            lines.append(f"{pad}{item} = {var}.get({name!r}, _MISSING)")
            if optional:
                lines.append(f"{pad}if {item} is not _MISSING:")
                _emit(sub, item, depth + 1, lines, consts, names)
            else:
                lines.append(f"{pad}if {item} is _MISSING: return False")
                _emit(sub, item, depth, lines, consts, names)
    elif isinstance(spec, (list, Many)):
        many = spec if isinstance(spec, Many) else Many(spec[0])
        item = fresh("v")
        lines.append(f"{pad}if not isinstance({var}, list) or len({var}) < {many.at_least}: return False")
        lines.append(f"{pad}for {item} in {var}:")
        _emit(many.spec, item, depth + 1, lines, consts, names)
    elif isinstance(spec, Each):
        item = fresh("v")
        lines.append(f"{pad}if not isinstance({var}, dict): return False")
        lines.append(f"{pad}for {item} in {var}.values():")
        _emit(spec.spec, item, depth + 1, lines, consts, names)
    elif spec is int:  # a JSON integer in [0, 2**62): not bool, not float
        lines.append(f"{pad}if type({var}) is not int or not 0 <= {var} < _MAX_INT: return False")
    elif isinstance(spec, Text) and spec.pattern in _PLAIN_TESTS:  # the common patterns without a regex
        lines.append(f"{pad}if not isinstance({var}, str) or not ({_PLAIN_TESTS[spec.pattern].format(var)}): return False")
    elif isinstance(spec, Text):
        pattern = fresh("p")
        consts[pattern] = re.compile(spec.pattern).fullmatch
        lines.append(f"{pad}if not isinstance({var}, str) or {pattern}({var}) is None: return False")
    else:
        leaf = fresh("s")
        consts[leaf] = spec
        lines.append(f"{pad}if _leaf_problem({var}, {leaf}) is not None: return False")
    if lines[-1].endswith(":"):  # a loop or an optional field with nothing to check
        lines.append(f"{pad}    pass")


_MATCHERS: dict[int, tuple[Any, Callable[[Any], bool]]] = {}  # id(spec) -> (spec, its matcher): specs live on


def check_schema(value: Any, spec: Any, where: str, field: str = "") -> None:
    """Raise an ``LmdataError`` naming the first field of ``value`` that does not match ``spec``."""
    known = _MATCHERS.get(id(spec))
    if known is None or known[0] is not spec:
        if len(_MATCHERS) > 64:  # a caller's spec built per call ([spec]) must not pile up
            _MATCHERS.clear()
        known = _MATCHERS[id(spec)] = (spec, _matcher(spec))
    if known[1](value):
        return
    _explain(value, spec, where, field)


def _explain(value: Any, spec: Any, where: str, field: str = "") -> None:
    """``check_schema``'s walk with field paths, for a value its matcher refused."""
    def fail(problem: str) -> LmdataError:
        return LmdataError(f"{where}: field {field or '(top level)'} {problem}; the manifest is corrupt "
                           "(re-run the ingest with --overwrite)")

    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise fail(f"is {_json_type(value)}, expected an object")
        for key, sub in spec.items():
            name, optional = key.rstrip("?"), key.endswith("?")
            path = f"{field}.{name}" if field else name
            if name not in value:
                if optional:
                    continue
                raise LmdataError(f"{where}: field {path} is missing; the manifest is corrupt "
                                  "(re-run the ingest with --overwrite)")
            _explain(value[name], sub, where, path)
    elif isinstance(spec, (list, Many)):
        spec = spec if isinstance(spec, Many) else Many(spec[0])
        if not isinstance(value, list):
            raise fail(f"is {_json_type(value)}, expected a list")
        if len(value) < spec.at_least:
            raise fail(f"holds {len(value)} items, expected at least {spec.at_least}")
        for i, item in enumerate(value):
            _explain(item, spec.spec, where, f"{field}[{i}]")
    elif isinstance(spec, Each):
        if not isinstance(value, dict):
            raise fail(f"is {_json_type(value)}, expected an object")
        for key, item in value.items():
            _explain(item, spec.spec, where, f"{field}.{key}")
    else:
        problem = _leaf_problem(value, spec)
        if problem is not None:
            raise fail(problem)


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
        check_schema(obj, SCHEMA, where)
        check_format_fields(obj, where)
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
                        f: [ShardInfo.from_checked(sh) for sh in entry["shards"]]
                        for f, entry in s.get("formats", {}).items()
                    },
                    provenance=([ShardInfo.from_checked(sh) for sh in s["provenance"]["shards"]]
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
    (``check_table_paths``; ``open_store`` does it with the size check's own ``lstat``)."""
    from lmdata.io.location import location

    loc = location(store, flag="store")
    manifest_loc = loc / MANIFEST_NAME
    try:
        raw = manifest_loc.read_bytes()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
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
    where the file is stat-ed, ``checksum.check_sizes``). ``{split: {table: shards}}``."""
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
