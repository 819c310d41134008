"""A store opened for reading: manifest checked, readers and datasets by split and format.

    store = open_store("runs/sample-store")
    store.splits                       # ['train', 'validation']
    store.formats("train")             # ['memmap', 'parquet', 'lance'] (as written)
    ds = store.dataset("train", seq_len=1024)          # TokenDataset over the default format
    store.document("train", 3)         # the 4th document's ids, end-of-text included
    store.tokenizer().decode(store.document("train", 3))

``open_store`` is cheap: it parses the manifest; a format's shard files are compared with it
(a ``stat`` per file locally) the first time a reader of that format is made, so a damaged
format never stops another from being read; the full checksum pass is ``verify_store``.
``Store.path`` is a ``Location`` either way.
"""

from __future__ import annotations

import inspect
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from lmdata._whole import whole
from lmdata.errors import LmdataError
from lmdata.io.cache import keyed_dir
from lmdata.io.location import Location, location
from lmdata.store import readlock
from lmdata.store.layout import TOKENIZER_DIR
from lmdata.store.manifest import Manifest, read_manifest, refuse_escaping_names
from lmdata.store.registry import get_format
from lmdata.store.protocol import FormatReader

# The default reader when a split holds several formats: fastest random reads first.
DEFAULT_FORMAT_ORDER = ("memmap", "lance", "parquet")  # the registry's built-ins


class Store:
    """A validated store: paths and the manifest; readers are made on demand."""

    def __init__(self, path: Any, manifest: Manifest, manifest_id: tuple[int, int, int] | None = None) -> None:
        self.path = location(path, flag="store")
        self.manifest = manifest
        # the manifest file this store was opened from: a reader made after an overwrite refuses
        self.manifest_id = manifest_id if manifest_id is not None or self.remote else \
            readlock.manifest_identity(self.path.local_path)
        self._checked: set[tuple[str, str]] = set()  # (split, format) whose shards ``_check_format`` passed

    @property
    def remote(self) -> bool:
        return self.path.remote

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r}, splits={self.splits})"

    @property
    def splits(self) -> list[str]:
        return list(self.manifest.splits)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.manifest.dtype)

    @property
    def eot_id(self) -> int:
        return self.manifest.eot_id

    def n_tokens(self, split: str) -> int:
        return self._split(split).n_tokens

    def formats(self, split: str) -> list[str]:
        """The formats ``split`` was written in, in the manifest's order."""
        return list(self._split(split).formats)

    def default_format(self, split: str) -> str:
        present = self.formats(split)
        for name in DEFAULT_FORMAT_ORDER:
            if name in present:
                return name
        if not present:
            raise LmdataError(f"{self.path}: split {split!r} holds no format; re-run the ingest")
        return present[0]

    def format_dir(self, split: str, fmt: str) -> Location:
        return self.path / split / fmt

    def reader(self, split: str, format: str | None = None, *, verify: str | None = None, **kwargs: Any) -> FormatReader:
        """The ``format`` reader of ``split`` (default: memmap, else lance, else parquet).

        ``verify``: how a built-in reader checks a shard the first time a process touches
        it, ``"first-use"`` (the default: the blocks or rows a read touches, a whole-file checksum where a
        store has none) or ``"size"`` (see ``checksum.py``).
        """
        if verify is not None:
            kwargs["verify"] = verify
        if format is not None and not (isinstance(format, str) and format):
            raise LmdataError(f"format={format!r}: give a format name ({', '.join(self.formats(split))}) or None")
        fmt = format or self.default_format(split)
        shards = self._split(split).formats.get(fmt)
        if shards is None:
            raise LmdataError(
                f"{self.path}: split {split!r} has no format {fmt!r}; formats there: {', '.join(self.formats(split))}"
            )
        if not self.remote:  # a store replaced since it was opened is said so, not named damaged
            readlock.check_unchanged(self.path.local_path, self.manifest_id)
        self._check_format(split, fmt, shards)
        make = get_format(fmt).reader
        if (takes := reader_options(make)) is not None and (unknown := sorted(set(kwargs) - takes)):
            raise LmdataError(f"reader option {unknown[0]!r}: the {fmt} reader takes {', '.join(sorted(takes)) or 'none'}")
        reader = make(self.format_dir(split, fmt), shards, self.dtype, **kwargs)
        if not self.remote:  # object storage has no readers' lock (see readlock.py)
            readlock.hold(self.path.local_path, reader)  # no ingest replaces the store while this reader lives
            readlock.check_unchanged(self.path.local_path, self.manifest_id)
        return reader

    def _check_format(self, split: str, fmt: str, shards: list[Any]) -> None:
        """A format's shards, the first time it is read: they hold the split's counts, and no recorded
        path is absolute or climbs out with ``..``. Each file's size, and that a symlink stays inside
        the store, are checked where a reader first touches the shard (``open_shards``, ``verify_shard``,
        ``read_small_file``), as a remote object is: stat-ing every file here made a reader's start
        grow with the store (100,010 shards: 300,041 ``lstat``s, 1.1-1.2 s before the first batch)."""
        if (split, fmt) in self._checked:
            return
        info = self._split(split)
        n_tok, n_docs = sum(s.n_tokens for s in shards), sum(s.n_docs for s in shards)
        if (n_tok, n_docs) != (info.n_tokens, info.n_docs):
            raise LmdataError(
                f"{self.path}/manifest.json: split {split!r} format {fmt!r} shards hold {n_tok} tokens/{n_docs} docs, "
                f"the split says {info.n_tokens}/{info.n_docs}; the manifest is corrupt (re-ingest)"
            )
        refuse_escaping_names(self.path, {split: {fmt: shards}})
        self._checked.add((split, fmt))

    def dataset(
        self, split: str, seq_len: int, format: str | None = None, *, reader_options: dict[str, Any] | None = None,
        verify: str | None = None, **kwargs: Any,
    ) -> Any:
        """``TokenDataset`` of ``split`` with windows of ``seq_len + 1`` ids.

        ``reader_options`` go to the format's reader (e.g. Parquet's ``cache_bytes``), as does
        ``verify`` (see ``reader``); the other keyword arguments go to ``TokenDataset``.
        """
        from lmdata.store.dataset import TokenDataset

        kwargs.setdefault("eot_id", self.eot_id)
        ds = TokenDataset(self.reader(split, format, verify=verify, **(reader_options or {})), seq_len, **kwargs)
        ds.tokenizer_hash = self.manifest.tokenizer_hash  # a mixture refuses sources of other tokenizers
        return ds

    def document(self, split: str, doc_id: int, format: str | None = None) -> np.ndarray:
        """Document ``doc_id`` of ``split`` (its end-of-text id included)."""
        n_docs = self._split(split).n_docs
        if not whole(doc_id, 0) or doc_id >= n_docs:
            raise LmdataError(f"document {doc_id!r}: split {split!r} has documents 0..{n_docs - 1}")
        return self.reader(split, format).document(doc_id)

    def tokenizer(self) -> Any:
        """The store's tokenizer (``<store>/tokenizer``), checked against the manifest's hash."""
        from lmdata.tokenizer import Tokenizer

        local = self.tokenizer_dir()
        try:
            tok = Tokenizer.load(local)
        except LmdataError as exc:  # a remote store's: name its objects, not the cache's copy of them
            if not self.remote or str(local) not in str(exc):
                raise
            said = str(exc).replace(str(local), str(self.path / TOKENIZER_DIR)).split("; ")[0]
            raise LmdataError(f"{said}; the store's tokenizer is damaged (re-ingest with --overwrite)") from None
        found = tok.hash
        if found != self.manifest.tokenizer_hash:
            raise LmdataError(
                f"{self.path / 'tokenizer'}: tokenizer hash {found[:12]} does not match the manifest's "
                f"{self.manifest.tokenizer_hash[:12]}; the store's tokenizer directory was changed (re-ingest)"
            )
        return tok

    def tokenizer_dir(self) -> Path:
        """A local directory holding the store's tokenizer files (a remote store's: fetched into the cache)."""
        return fetch_tokenizer(self.path) if self.remote else self.path.local_path / TOKENIZER_DIR

    def _split(self, split: str) -> Any:
        info = self.manifest.splits.get(split)
        if info is None:
            raise LmdataError(f"{self.path}: no split {split!r}; splits: {', '.join(self.splits) or '(none)'}")
        return info


def reader_options(make: Any) -> set[str] | None:
    """The keyword options a format's reader takes besides its directory, shards and dtype; None when it
    takes any (``**kwargs``) or cannot say (``Store.reader`` and ``verify`` ask it)."""
    try:
        params = inspect.signature(make).parameters
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return {n for n, p in list(params.items())[3:] if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def open_store(path: str | Path, *, tokenizer_hash: str | None = None) -> Store:
    """Open a store: parse and validate its manifest. Nothing here grows with the number of shard
    files but the manifest's parse: a format's recorded paths are checked when a reader of it is
    first made (``Store._check_format``), and each file's size where a reader first opens it.

    A remote store's objects are not listed here: a LIST pages 1,000 keys a request, in turn,
    so opening a 1,160-shard store on moto spent 2.6 of its 3.2 s listing 9,293 objects, and a
    100,000-shard store would list for minutes before its first batch. Each object is checked
    when a reader first reads it instead (a whole GET: its size and checksum; a ranged read: its
    length and the block CRCs of a sidecar checked against its checksum), and a missing one is
    named there (``s3://...: no such object``); ``lmdata verify`` checks them all.

    ``tokenizer_hash``: refuse the store unless its tokenizer has this hash (a training
    job pins the tokenizer its model was built for).
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise LmdataError(f"open_store({path!r}): give a store's directory or s3:// URI")
    loc = location(path, flag="store")
    # before the read: a replaced manifest is then noticed (local stores; a remote one has no readers' lock)
    manifest_id = None if loc.remote else readlock.manifest_identity(loc.local_path)
    manifest = read_manifest(loc, check_paths=False)  # each table's paths: when it is first read
    if tokenizer_hash is not None and tokenizer_hash != manifest.tokenizer_hash:
        raise LmdataError(
            f"{loc}: store was tokenized with tokenizer {manifest.tokenizer_hash[:12]}, not the expected "
            f"{tokenizer_hash[:12]}; use the matching store or re-ingest with that tokenizer"
        )
    return Store(loc, manifest, manifest_id)


def fetch_tokenizer(loc: Location) -> Path:
    """The store's tokenizer directory, downloaded once into the local cache (small: a few files)."""
    target = keyed_dir("tokenizers", loc.uri)
    src = loc / TOKENIZER_DIR
    files = src.list(recursive=True)
    if not files:
        raise LmdataError(f"{src}: the store has no tokenizer; re-ingest with --overwrite")
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    for f in files:
        dest = tmp / f.key
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(f.loc.read_bytes())
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target
