"""Where each document came from: an optional per-split table beside the formats.

    <store>/<split>/_provenance/origins-00000.npy   int64 [n_docs, 2] of ingest shard 00000:
                                                    (source, offset) of each of its documents
    <store>/<split>/_provenance/_shards/00000.json  its completion record (as a format's)
    manifest.json: splits.<split>.provenance = {"shards": [shard, ...]}   (files with checksums)

``source`` indexes the split's ``sources`` list in the manifest (path or URI, size, checksum);
``offset`` is where the document starts in that file: the byte of its (decompressed) stream
for text, lines and JSONL inputs, the row for Parquet and Arrow inputs. The table's shards
are the ingest's shards (same index, documents and tokens), whatever the formats regroup.

Written by the engine-neutral core (``ingest.shards.ShardCutter``) before the formats get a
shard, so every shard a resumed ingest reuses has its record. A store written before this
table (no ``provenance`` key) reads as before; asked for a source, it says it is unknown.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import LmdataError
from lmdata.io.location import Location, location
from lmdata.store.checksum import read_small_file, write_shard_parts
from lmdata.store.formats import base
from lmdata.store.layout import PROVENANCE_DIR, RECORD_DIR
from lmdata.store.manifest import refuse_escaping_names
from lmdata.store.npy import int64_array
from lmdata.store.protocol import ShardInfo

UNKNOWN = "(unknown: the store was ingested before lmdata recorded sources)"


def _name(index: int) -> str:
    return f"origins-{index:05d}.npy"


class ProvenanceWriter:
    """Writes a split's origins shard by shard, with completion records like a format's."""

    def __init__(self, split_dir: Path) -> None:
        self.dir = Path(split_dir) / PROVENANCE_DIR
        self.dir.mkdir(parents=True, exist_ok=True)

    def completed(self) -> dict[int, ShardInfo]:
        return base.completed(self.dir)

    def drop_damaged(self, done: dict[int, ShardInfo]) -> dict[int, ShardInfo]:
        """``base.intact`` over the completed records ``done``."""
        return base.intact(self.dir, done, lambda index, _: base.record_path(self.dir, index))

    def write_shard(self, index: int, origins: np.ndarray, n_tokens: int, first_doc: int, first_token: int) -> ShardInfo:
        """Shard ``index``'s origins (``[n_docs, 2]`` int64), durable before its record."""
        origins = np.ascontiguousarray(origins, dtype="<i8").reshape(-1, 2)
        base.forget(self.dir, index)
        replaced, info = write_shard_parts(self.dir, _name(index), [base.npy_bytes(origins)])
        shard = ShardInfo(name=f"{index:05d}", n_docs=len(origins), n_tokens=n_tokens, first_doc=first_doc,
                          first_token=first_token, files=[info])
        base.write_record(self.dir, index, shard, sync_dirs=[self.dir] if replaced else [])
        return shard

    def cleanup_partial(self) -> None:
        base.remove_temporaries(self.dir)

    def finish(self, n_docs: int, n_tokens: int) -> list[ShardInfo] | None:
        """The records tiling the split's ``n_docs`` documents (others pruned, made durable);
        None, with the directory removed, when they do not (an engine that recorded none)."""
        found, shards, doc, tok = self.completed(), [], 0, 0
        for index in range(len(found)):
            s = found.get(index)
            if s is None or (s.first_doc, s.first_token) != (doc, tok) or doc >= n_docs:
                break
            shards.append(s)
            doc, tok = doc + s.n_docs, tok + s.n_tokens
        if (doc, tok) != (n_docs, n_tokens):
            import shutil

            shutil.rmtree(self.dir, ignore_errors=True)
            return None
        base.prune(self.dir, shards)
        base.sync_dirs(self.dir, self.dir / RECORD_DIR, self.dir.parent)
        return shards


# ---------------------------------------------------------------------------- reading


def read_origins(split_dir: Location | str, shard: ShardInfo, local_dir: str | None = None) -> np.ndarray:
    """One shard's ``[n_docs, 2]`` origins, checked against its checksum (small: 16 bytes a document).
    ``local_dir``: the split's provenance directory as a string, for a local store (a path joined and
    read without ``Location``'s path objects: ~20 us a shard of ``lmdata inspect``'s)."""
    if len(shard.files) != 1:
        raise LmdataError(f"{location(split_dir) / PROVENANCE_DIR}: provenance of shard {shard.name} records "
                          f"{len(shard.files)} files, expected 1; the manifest is corrupt (re-ingest with --overwrite)")
    (info,) = shard.files
    # ``origins`` refused recorded paths that leave the store; a symlink is followed only inside it
    path: Any = (location(split_dir) / PROVENANCE_DIR / info.path) if local_dir is None \
        else os.path.join(local_dir, info.path)
    try:
        raw = path.read_bytes() if local_dir is None else read_small_file(local_dir, shard, info, "size")[1]
    except (OSError, LmdataError) as exc:
        raise LmdataError(f"{path}: provenance of shard {shard.name} cannot be read ({exc}); "
                          "run `lmdata verify` and re-ingest with --overwrite") from None
    if len(raw) != info.bytes or not info.matches(raw):
        raise LmdataError(f"{path}: provenance of shard {shard.name} fails its {info.algo} checksum; "
                          "run `lmdata verify` and re-ingest with --overwrite")
    origins = int64_array(raw)
    if origins.dtype != np.int64 or origins.shape != (shard.n_docs, 2):
        raise LmdataError(f"{path}: provenance of shard {shard.name} holds {origins.dtype} {origins.shape}, "
                          f"not int64 ({shard.n_docs}, 2); re-ingest with --overwrite")
    return origins


class Origins:
    """Documents -> (source path, offset) for one split; shards read once each, on demand."""

    def __init__(self, split_dir: Location | str, shards: list[ShardInfo] | None, sources: list[dict[str, Any]]) -> None:
        self.split_dir, self.shards, self.sources = location(split_dir), shards, sources
        self._firsts = np.array([s.first_doc for s in shards or []], dtype=np.int64)
        self._cache: dict[int, np.ndarray] = {}
        prov = self.split_dir / PROVENANCE_DIR
        self._local = None if prov.remote else os.fspath(prov.local_path)

    @property
    def known(self) -> bool:
        return self.shards is not None

    def shard(self, i: int) -> np.ndarray:
        if i not in self._cache:
            self._cache[i] = read_origins(self.split_dir, self.shards[i], self._local)
        return self._cache[i]

    def path(self, source: int) -> str:
        if not 0 <= source < len(self.sources):
            raise LmdataError(f"{self.split_dir}: provenance names source {source}, the manifest lists "
                              f"{len(self.sources)}; re-ingest with --overwrite")
        return str(self.sources[source]["path"])

    def unit(self, source: int) -> str:
        """What a source's offsets count: ``row`` for Parquet and Arrow inputs, else ``byte``."""
        from lmdata.sources import ARROW_SUFFIXES

        name = self.path(source).rsplit("/", 1)[-1].lower().removesuffix(".gz").removesuffix(".zst")
        return "row" if name.endswith((".parquet", *ARROW_SUFFIXES)) else "byte"

    def span(self, first: int, n: int) -> np.ndarray | None:
        """``[n, 2]`` (source, offset) of documents ``first .. first + n - 1``; None without the record."""
        if not self.known:
            return None
        parts, doc, end = [], first, first + n
        while doc < end:
            i = int(np.searchsorted(self._firsts, doc, side="right") - 1)
            s = self.shards[i] if i >= 0 else None
            if s is None or doc >= s.first_doc + s.n_docs:
                raise LmdataError(f"{self.split_dir}: provenance does not cover document {doc}; run `lmdata verify`")
            stop = min(end, s.first_doc + s.n_docs)
            parts.append(self.shard(i)[doc - s.first_doc:stop - s.first_doc])
            doc = stop
        return np.concatenate(parts) if parts else np.zeros((0, 2), dtype=np.int64)

    def of(self, doc_id: int) -> tuple[str, int] | None:
        """(path or URI, byte offset or row) of ``doc_id``; None in a store without the record."""
        if not self.known:
            return None
        total = self.shards[-1].first_doc + self.shards[-1].n_docs if self.shards else 0
        if not 0 <= doc_id < total:
            raise LmdataError(f"document {doc_id} does not exist; the split has {total} documents")
        i = int(np.searchsorted(self._firsts, doc_id, side="right") - 1)
        source, offset = self.shard(i)[doc_id - self.shards[i].first_doc].tolist()
        return self.path(source), offset


def origins(store: Any, split: str) -> Origins:
    """``Origins`` of a ``Store``'s split, no recorded path absolute or climbing out with ``..`` (here,
    not in ``open_store``: a loader that never asks where a document came from does not pay it; a
    symlink is checked where its file is read)."""
    info = store.manifest.splits[split]
    if info.provenance is not None:
        refuse_escaping_names(store.path, {split: {PROVENANCE_DIR: info.provenance}})
    return Origins(store.path / split, info.provenance, info.sources)


def problems(split_dir: Location, where: str, shards: list[ShardInfo], n_docs: int, n_sources: int) -> list[str]:
    """``lmdata verify``'s checks of a split's provenance: tiling, files, values."""
    out, doc = [], 0
    for s in shards:
        if s.first_doc != doc:
            out.append(f"{where} shard {s.name}: starts at doc {s.first_doc}, expected {doc}")
        doc = s.first_doc + s.n_docs
        try:
            rows = read_origins(split_dir, s)
        except LmdataError as exc:
            out.append(f"{where} shard {s.name}: {exc}")
            continue
        if len(rows) and (rows[:, 0].min() < 0 or rows[:, 0].max() >= n_sources or rows[:, 1].min() < 0):
            out.append(f"{where} shard {s.name}: names a source or offset outside the split's {n_sources} sources")
    if doc != n_docs:
        out.append(f"{where}: records {doc} documents, the split has {n_docs}")
    return out
