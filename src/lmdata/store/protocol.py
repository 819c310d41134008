"""The tiny protocol every storage format implements: one writer, one reader.

A format is one module in ``lmdata/store/formats/`` that calls ``register_format(name, Writer,
Reader)``. Nothing outside ``store/`` knows a format by name.

Writer (one per split per ingest, in the ingest's main process)::

    w = Writer(format_dir, dtype)          # format_dir = <store>/<split>/<format>/
    w.completed()                          # {index: ShardInfo} already complete on disk (resume)
    w.write_shard(index, tokens, doc_starts, first_doc, first_token)  -> ShardInfo
        tokens:      1-D array of `dtype`, the shard's documents concatenated, each ending with eot
        doc_starts:  int64, each document's start offset within the shard, then len(tokens)
        first_doc:   global document id of the shard's first document
        first_token: global offset of the shard's first token
        The shard is written under a temporary name, fsynced and renamed when complete.
    w.finish(shards) -> list[ShardInfo] | None
        after the last shard: the shards the manifest records for this format, or None
        for ``shards`` unchanged. A format may regroup shards here (Lance commits a few
        large fragments, each a run of whole shards), so formats' shard lists may differ;
        every list tiles the same stream.
    w.cleanup_partial()                    # remove temp files / unreferenced files of a crash

Reader (holds paths only; opens files lazily, so it pickles small to worker processes)::

    r = Reader(format_dir, shards, dtype)  # shards: list[ShardInfo] from the manifest
    r.check()                              # cheap: every file's size against the manifest
    r.n_tokens                             # tokens in the split
    r.windows(starts, length) -> integer np.ndarray of shape [len(starts), length]
        the token stream's slices [s, s + length) for each global offset s, best in the
        store's dtype (``TokenDataset`` widens to int64, and the loader's workers hand
        over the store's dtype, so a reader that widens early only costs a copy)
    r.document(doc_id) -> np.ndarray       # one document's tokens (eot included)
    r.doc_starts(i) -> np.ndarray[int64]   # shard i's document starts within the shard, then
                                           # its n_tokens (the per-document index: ``inspect``
                                           # and the ``docs`` view of ``lmdata sql``)

Optional reader method, for formats that hold rows (Parquet, Lance; not memmap)::

    r.arrow_rows() -> the split's rows (doc_id int64, token_offset int64, tokens list<int>),
        documents cut into pieces, for the ``tokens`` view of ``lmdata sql``: a
        ``pyarrow.dataset.Dataset`` (DuckDB pushes WHERE down to it) or any object whose
        ``__arrow_c_stream__`` gives a fresh stream per call (DuckDB may scan it twice in
        one query). An object that also has ``shards`` (the ``ShardInfo`` its rows come
        from) and ``batches(range_of_shard_indexes)`` (as ``parquet.VerifiedRows``) is
        registered as groups of shards, so a WHERE on doc_id reads one group. A format
        without ``arrow_rows`` is simply absent from the ``tokens`` view.

A reader written before ``doc_starts`` existed still works: ``inspect`` then measures each
document with ``document`` (slow: it reads every token).

Conventions of the built-in formats (compatible extensions of the above):

- Readers may take extra keyword-only options after ``dtype`` (Parquet: ``cache_bytes``);
  ``Store.reader(split, format, **options)`` passes them through.
- ``windows`` raises ``IndexError`` for a window outside ``[0, n_tokens)``; ``document``
  raises ``LmdataError`` for a doc id that does not exist.
- A writer marks a shard complete with ``<format_dir>/_shards/NNNNN.json`` (the ShardInfo,
  written after the shard's files are durable); ``completed()`` returns those whose files
  are all present with the recorded size (``lmdata.store.formats.base``).
- Temporary files are named ``.NAME.tmp-PID``; ``cleanup_partial`` removes them.
- A reader class may set ``fork_safe = False`` (Lance does: its runtime hangs or crashes
  forked children once the parent has used it, and its reader refuses there);
  ``make_loader`` then starts workers with forkserver instead of fork, with a warning.
  Threads a reader runs behind the caller's back (remote shards fetched in the background)
  must keep it fork-safe otherwise: they fetch inside ``io.background.fetching()``, which a
  fork waits for.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from lmdata.io import digests


@dataclass(init=False)
class FileInfo:
    """One file of a shard, relative to the format directory, with its checksum (``io/digests.py``)."""

    path: str
    bytes: int
    digest: str  # hex
    algo: str = digests.WRITE_ALGO  # stores written before 2026-12-07: sha256

    def __init__(self, path: str, bytes: int, digest: str | None = None, algo: str = digests.WRITE_ALGO, *,
                 sha256: str | None = None) -> None:
        if sha256 is not None:  # the keyword before store format 3, kept for plug-in formats' writers
            warnings.warn("FileInfo(sha256=HEX) is deprecated: pass digest=HEX, algo='sha256' (or let "
                          "lmdata.store.checksum.file_info hash the file)", DeprecationWarning, stacklevel=2)
            digest, algo = sha256, "sha256"
        if digest is None:
            raise TypeError(f"FileInfo({path!r}) needs its checksum (digest=HEX)")
        self.path, self.bytes, self.digest, self.algo = path, bytes, digest, algo

    @property
    def sha256(self) -> str:
        """Deprecated (before store format 3 every file recorded one): the digest, where it is a sha256."""
        if self.algo != "sha256":
            raise AttributeError(f"{self.path} records an {self.algo} checksum, not a sha256: read .digest and "
                                 ".algo, or call .matches(data)")
        warnings.warn("FileInfo.sha256 is deprecated: read .digest and .algo", DeprecationWarning, stacklevel=2)
        return self.digest

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, self.algo: self.digest}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "FileInfo":
        """An entry that records one checksum (KeyError when none)."""
        algo, digest = digests.recorded(obj)
        return cls(obj["path"], obj["bytes"], digest, algo)

    def matches(self, data: Any) -> bool:
        """Whether ``data`` (the file's bytes) has the recorded checksum."""
        return digests.of(data, self.algo) == self.digest


@dataclass
class ShardInfo:
    """A shard as the manifest records it: counts, its place in the stream, its files."""

    name: str
    n_docs: int
    n_tokens: int
    first_doc: int
    first_token: int
    files: list[FileInfo] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # format-specific (e.g. Lance fragment id)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "n_docs": self.n_docs, "n_tokens": self.n_tokens, "first_doc": self.first_doc,
                "first_token": self.first_token, "files": [f.to_json() for f in self.files],
                "extra": copy.deepcopy(self.extra)}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "ShardInfo":
        """A shard entry from JSON nothing has checked (a completion record): a count that is no
        integer is a ValueError or TypeError."""
        files = [FileInfo.from_json({**f, "bytes": int(f["bytes"])}) for f in obj.get("files", [])]
        return cls(
            name=obj["name"],
            n_docs=int(obj["n_docs"]),
            n_tokens=int(obj["n_tokens"]),
            first_doc=int(obj["first_doc"]),
            first_token=int(obj["first_token"]),
            files=files,
            extra=dict(obj.get("extra", {})),
        )

    @classmethod
    def from_checked(cls, obj: dict[str, Any]) -> "ShardInfo":
        """A shard entry the manifest's schema has checked (its counts are integers already): no
        conversions, positional fields (35,284 entries of an 11,761-shard manifest)."""
        files = [FileInfo.from_json(f) for f in obj.get("files", ())]
        return cls(obj["name"], obj["n_docs"], obj["n_tokens"], obj["first_doc"], obj["first_token"], files,
                   dict(obj.get("extra", ())))


class FormatWriter(Protocol):
    format_dir: Any  # where it writes (the constructor's argument)

    def __init__(self, format_dir: Any, dtype: np.dtype) -> None: ...
    def completed(self) -> dict[int, ShardInfo]: ...
    def write_shard(
        self, index: int, tokens: np.ndarray, doc_starts: np.ndarray, first_doc: int, first_token: int
    ) -> ShardInfo: ...
    def finish(self, shards: list[ShardInfo]) -> list[ShardInfo] | None: ...
    def cleanup_partial(self) -> None: ...


class FormatReader(Protocol):
    n_tokens: int

    def __init__(self, format_dir: Any, shards: list[ShardInfo], dtype: np.dtype) -> None: ...
    def check(self) -> None: ...
    def windows(self, starts: np.ndarray, length: int) -> np.ndarray: ...
    def document(self, doc_id: int) -> np.ndarray: ...
    def doc_starts(self, i: int) -> np.ndarray: ...
