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
from typing import Any

from lmdata import _atomic
from lmdata.errors import LmdataError
from lmdata.store.protocol import ShardInfo

FORMAT_VERSION = 2  # 2: memmap shards carry block checksums (tokens-*.bin.crc); version 1 stores still read
MANIFEST_NAME = "manifest.json"
STORE_FORMAT = "lmdata-store"  # the manifest's "format": what makes a directory an lmdata store
DTYPES = ("uint16", "uint32")
_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# the store's own entries beside the split directories (ingest-plan.json: see ``ingest_output``)
_RESERVED = frozenset({"tokenizer", MANIFEST_NAME, "ingest-plan.json"})


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


@dataclass
class SplitInfo:
    n_docs: int
    n_tokens: int
    sources: list[dict[str, Any]] = field(default_factory=list)
    formats: dict[str, list[ShardInfo]] = field(default_factory=dict)


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
                }
                for name, s in self.splits.items()
            },
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any], where: str = MANIFEST_NAME) -> "Manifest":
        try:
            if obj.get("format", STORE_FORMAT) != STORE_FORMAT:  # absent in manifests written before it
                raise LmdataError(f"{where}: not an lmdata store manifest (format {obj.get('format')!r}, "
                                  f"expected {STORE_FORMAT!r})")
            version = int(obj["format_version"])
            if version > FORMAT_VERSION:
                raise LmdataError(
                    f"{where}: store format version {version} is newer than this lmdata supports "
                    f"({FORMAT_VERSION}); upgrade lmdata to read it"
                )
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
                        f: [ShardInfo.from_json(sh) for sh in entry["shards"]]
                        for f, entry in s.get("formats", {}).items()
                    },
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


def write_manifest(store: Path, manifest: Manifest) -> None:
    """Write ``<store>/manifest.json`` atomically (the last step of an ingest)."""
    data = json.dumps(manifest.to_json(), indent=1, sort_keys=False).encode() + b"\n"
    _atomic.write_bytes(Path(store) / MANIFEST_NAME, data)


def read_manifest(store: Any) -> Manifest:
    """Read and validate ``<store>/manifest.json``; a clear error if it is not a store.

    ``store``: a local path or a ``Location`` (``s3://``: one GET).
    """
    from lmdata.store.uri import Location

    if isinstance(store, Location) and store.remote:
        return _read_remote_manifest(store)
    path = Path(store) / MANIFEST_NAME
    if not Path(store).is_dir():
        raise LmdataError(f"{store}: no such store directory; create one with `lmdata ingest`")
    if not path.is_file():
        raise LmdataError(
            f"{store}: not a store (no {MANIFEST_NAME}); an interrupted ingest can be finished with "
            "`lmdata ingest ... --resume`"
        )
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LmdataError(f"{path}: not valid JSON ({exc}); re-run the ingest with --overwrite") from exc
    manifest = Manifest.from_json(obj, where=str(path))
    for split, info in manifest.splits.items():
        for fmt, shards in info.formats.items():
            base = Path(store) / split / fmt
            for shard in shards:
                for f in shard.files:
                    resolve_inside(Path(store), base, f.path)
    return manifest


def _read_remote_manifest(store: Any) -> Manifest:
    obj_loc = store / MANIFEST_NAME
    try:
        raw = obj_loc.read_bytes()
    except FileNotFoundError:
        if not type(store)(store.scheme, store.bucket).exists():
            from lmdata.store.uri import remote_error

            raise remote_error(OSError("NoSuchBucket"), store) from None
        raise LmdataError(
            f"{store.uri}: not a store (no {MANIFEST_NAME}); an interrupted ingest can be finished with "
            "`lmdata ingest ... --resume`"
        ) from None
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LmdataError(f"{obj_loc.uri}: not valid JSON ({exc}); re-run the ingest with --overwrite") from exc
    manifest = Manifest.from_json(obj, where=obj_loc.uri)
    for info in manifest.splits.values():
        for shards in info.formats.values():
            for shard in shards:
                for f in shard.files:  # no symlinks on object storage: the relative path is the check
                    if os.path.isabs(f.path) or ".." in Path(f.path).parts:
                        raise LmdataError(f"{obj_loc.uri}: path {f.path!r} escapes the store; the manifest is corrupt")
    return manifest


def resolve_inside(store: Path, base: Path, relpath: str) -> Path:
    """``base / relpath``, refusing absolute paths, ``..`` and symlinks that leave ``store``."""
    if os.path.isabs(relpath) or ".." in Path(relpath).parts:
        raise LmdataError(f"{store}/{MANIFEST_NAME}: path {relpath!r} escapes the store; the manifest is corrupt")
    full = (base / relpath)
    root = Path(store).resolve()
    if full.exists() or full.is_symlink():
        real = full.resolve()
        if root != real and root not in real.parents:
            raise LmdataError(f"{full}: resolves outside the store ({real}); refusing to read it")
    return full
