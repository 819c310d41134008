"""The Ray engine writing an ``s3://`` store itself: no shared filesystem, no token array at the driver.

    input files ──a read task per file (a streaming generator)──▶ document batches (object refs)
        ──encode tasks──▶ (counts, tokens): the driver fetches the counts only
        ──driver: the shared ``ShardCutter`` on per-document token counts (the same cut points),
          joining references ``(batch ref, start, stop)`` instead of arrays
        ──per shard and format, a write task: fetches its batches from the object store, runs the
          format's ``write_shard`` in a local directory of its own node (``$LMDATA_CACHE_DIR/ray-shards``),
          uploads the shard's files, then its completion record, and deletes the local copy
        ──per format, a finish task: memmap/Parquet drop records another plan cut (``prune``) and read
          each shard's last document back; Lance mirrors its format prefix, groups and commits
          (``LanceWriter.finish``), uploads what is new (data first), deletes what finish removed
        ──(``publish``) tokenizer, provenance and ``manifest.json`` last, from the driver's staging

Why it equals the local engine's store: the same readers, encoder, cutter and writers; every
object is a file the format's own writer produced, uploaded unchanged (``tests/ingest/test_ray_store.py``
compares the two stores byte for byte). The driver's staging directory holds only the plan, the lock,
the tokenizer, the provenance records and the manifest; no task reads it.

Resume: the completion records are in the store, so ``--resume`` (on any machine) reuses every shard
whose record lists objects of the recorded sizes; a write task deletes a shard's old record before
uploading its files. Which machine resumes matters only for provenance (kept in the driver's staging):
on another machine the shards are redone.
"""

from __future__ import annotations

import json
import pickle
import shutil
import tempfile
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.ingest import encode
from lmdata.ingest.publish import local_files, _rank
from lmdata.ingest.ray import (MAX_RETRIES, RayEngine, _Dispatch, _document_offsets, _encode_rows, _lmdata_cause,
                               _maybe_fault, _maybe_hold, _read_file, check_committed, require_ray)
from lmdata.ingest.shards import ShardCutter, SplitReport, progress_bar, start_split
from lmdata.io.cache import keyed_dir
from lmdata.io.location import Location, location
from lmdata.io.s3 import apply_aws_environment, aws_environment
from lmdata.sources import expand
from lmdata.store.layout import PLAN_NAME, RECORD_DIR
from lmdata.store.protocol import ShardInfo

RECEIVED = {"bytes": 0}  # what this driver fetched from tasks (pickled sizes): counts and records, not tokens


# ---------------------------------------------------------------------------- the store's records


def _record_key(index: int) -> str:
    return f"{RECORD_DIR}/{index:05d}.json"


def _read_records(fmt: Location, sizes: dict[str, int], folder: str) -> dict[str, ShardInfo]:
    """Records under ``folder`` whose files are all in the store with the recorded sizes, by key stem."""
    found = {}
    for key in sizes:
        parent, _, name = key.rpartition("/")
        if parent != folder or not name.endswith(".json"):
            continue
        try:
            shard = ShardInfo.from_json(json.loads((fmt / key).read_bytes()))
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            continue
        if all(sizes.get(f.path) == f.bytes and ".." not in f.path.split("/") for f in shard.files):
            found[name[:-5]] = shard
    return found


def store_completed(fmt: Location, label: str) -> dict[int, ShardInfo]:
    """``FormatWriter.completed`` read from the store (one LIST, one GET per record)."""
    sizes = {x.key: x.size for x in fmt.list(recursive=True)}
    done = {int(k): s for k, s in _read_records(fmt, sizes, RECORD_DIR).items() if k.isdigit()}
    if label == "lance":  # LanceWriter.completed: staged shards of this layout, then fragments' members
        from lmdata.store.formats import lance_fragments

        done = {i: s for i, s in done.items() if lance_fragments.current_layout(s)}
        for fragment in _read_records(fmt, sizes, lance_fragments.GROUP_DIR).values():
            if lance_fragments.current_layout(fragment):
                done.update(lance_fragments.members(fragment))
    return done


# ---------------------------------------------------------------------------- tasks (run on workers)


def _read_stream(spec: Any, path: str, file: int, first_doc: int, window: tuple, batch_bytes: int,
                 aws: dict[str, str]) -> Iterator[Any]:
    import pyarrow as pa

    yield from _read_file(pa.table({"file": [file], "path": [path], "first_doc": [first_doc]}), spec, window,
                          batch_bytes, aws)


def _encode_batch(table: Any, shipped: list[Any], eot: int, dtype: str) -> tuple[dict[str, Any], np.ndarray]:
    """(counts, tokens): two objects, so the driver can fetch the first alone."""
    (row,) = _encode_rows(table, shipped, eot, dtype).to_pylist()
    tokens = np.frombuffer(row.pop("tokens"), dtype=dtype)
    row["lengths"] = np.frombuffer(row["lengths"], dtype=np.int64)
    return row, tokens


def _work_dir(fmt_uri: str, name: str) -> Path:
    root = keyed_dir("ray-shards", fmt_uri)  # under this node's $LMDATA_CACHE_DIR
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))


def _write_to_store(label: str, fmt_uri: str, dtype: str, index: int, pieces: list[tuple[Any, int, int]],
                    doc_starts: np.ndarray, first_doc: int, first_token: int, aws: dict[str, str]) -> ShardInfo:
    """Write one shard locally with the format's writer; upload its files, then its record."""
    import ray

    from lmdata.store.registry import get_format

    apply_aws_environment(aws)
    _maybe_fault(f"write-{label}-{index:05d}")
    fmt = location(fmt_uri)
    (fmt / _record_key(index)).delete()  # an old record must never name the files about to be replaced
    arrays = ray.get([ref for ref, _, _ in pieces])
    tokens = np.concatenate([a[start:stop] for a, (_, start, stop) in zip(arrays, pieces)])
    del arrays
    work = _work_dir(fmt_uri, f"{index:05d}")
    _maybe_hold()
    try:
        shard = get_format(label).writer(work, np.dtype(dtype)).write_shard(index, tokens, doc_starts, first_doc,
                                                                            first_token)
        for f in shard.files:
            (fmt / f.path).upload(work / f.path)
        (fmt / _record_key(index)).upload(work / _record_key(index))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _maybe_fault(f"wrote-{label}-{index:05d}")  # files and record uploaded, result lost
    return shard


class _StoreFormat:
    """What ``check_committed`` reads: a format directory (here: in the store)."""

    def __init__(self, format_dir: Any) -> None:
        self.format_dir = format_dir


def _prune_store(fmt: Location, shards: list[ShardInfo]) -> None:
    """``base.prune`` in the store: records (and their files) of shards not in ``shards``."""
    sizes = {x.key: x.size for x in fmt.list(recursive=True)}
    keep_names, keep_files = {s.name for s in shards}, {f.path for s in shards for f in s.files}
    for stem, shard in _read_records(fmt, sizes, RECORD_DIR).items():
        if shard.name not in keep_names:
            for f in shard.files:
                if f.path not in keep_files and ".." not in f.path.split("/"):
                    (fmt / f.path).delete()
            (fmt / f"{RECORD_DIR}/{stem}.json").delete()


def _download(src: Location, dst: Path) -> None:
    import pyarrow.fs as pafs

    dst.parent.mkdir(parents=True, exist_ok=True)
    pafs.copy_files(src.fs_path, str(dst), source_filesystem=src.fs, destination_filesystem=pafs.LocalFileSystem())


def _finish_lance(fmt: Location, dtype: str, eot: int, shards: list[ShardInfo], last_docs: dict[int, int]) -> list:
    """``LanceWriter.finish`` on a local mirror of the format prefix, then the store made equal to it."""
    from lmdata.store.formats.lance import LanceWriter

    before = {x.key: x for x in fmt.list(recursive=True)}
    work = _work_dir(fmt.uri, "finish")
    try:
        for key, x in before.items():
            _download(x.loc, work / key)
        writer = LanceWriter(work, np.dtype(dtype))
        writer.cleanup_partial()  # what retried writes left: their first attempts' data files
        finished = writer.finish(shards)
        check_committed("lance", writer, finished, last_docs, dtype, eot)
        after = local_files(work)  # in upload order: data, then records and Lance's versions
        for rel in after:
            if _rank(rel) > 0 or rel not in before or before[rel].size != (work / rel).stat().st_size:
                (fmt / rel).upload(work / rel)
        for key, x in before.items():
            if key not in set(after):
                x.loc.delete()  # what finish removed (staging fragments), after the commit is in the store
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return finished


def _finish_in_store(label: str, fmt_uri: str, dtype: str, eot: int, shards: list[ShardInfo],
                     last_docs: dict[int, int], aws: dict[str, str]) -> list[ShardInfo]:
    apply_aws_environment(aws)
    fmt = location(fmt_uri)
    if label == "lance":
        return _finish_lance(fmt, dtype, eot, shards, last_docs)
    _prune_store(fmt, shards)
    check_committed(label, _StoreFormat(fmt), shards, last_docs, dtype, eot)
    return shards


# ---------------------------------------------------------------------------- the driver


def _fetched(obj: Any) -> Any:
    RECEIVED["bytes"] += len(pickle.dumps(obj, protocol=5))
    return obj


class _Batch:
    """An encoded batch the driver never fetches: slicing it names a piece (ref, start, stop)."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def __getitem__(self, piece: slice) -> tuple[Any, int, int]:
        return self.ref, piece.start, piece.stop


def _join(pieces: list[tuple[Any, int, int]]) -> list[tuple[Any, int, int]]:
    """A shard's documents as pieces of batches, consecutive slices of one batch merged."""
    out: list[tuple[Any, int, int]] = []
    for ref, start, stop in pieces:
        if out and out[-1][0] == ref and out[-1][2] == start:
            out[-1] = (ref, out[-1][1], stop)
        else:
            out.append((ref, start, stop))
    return out


class _RefCutter(ShardCutter):
    join = staticmethod(_join)


class _StoreDispatch(_Dispatch):
    """``_Dispatch`` whose write tasks get references and write to the store."""

    def __init__(self, depth: int, dtype: str, aws: dict[str, str]) -> None:
        super().__init__(depth)
        self.task = require_ray().remote(max_retries=MAX_RETRIES)(_write_to_store)
        self.dtype, self.aws = dtype, aws

    def submit(self, w: "_StoreWriter", index: int, pieces: Any, doc_starts: np.ndarray, first_doc: int,
               first_token: int) -> Any:
        ray = require_ray()
        while len(self.inflight) >= self.depth:
            ray.get(self.inflight.popleft())  # back-pressure; raises a failed write early (counted once, below)
        ref = self.task.remote(w.label, w.fmt.uri, self.dtype, index, pieces, doc_starts, first_doc, first_token,
                               self.aws)
        self.inflight.append(ref)
        self.expected[(w.label, index)] = (len(doc_starts) - 1, int(doc_starts[-1]), first_doc, first_token,
                                           int(doc_starts[-1] - doc_starts[-2]))
        return ref


class _StoreWriter:
    """A format's writer in the store: ``write_shard`` is a task; records are read from the store."""

    def __init__(self, label: str, fmt: Location, dispatch: _StoreDispatch) -> None:
        self.label, self.fmt, self.dispatch = label, fmt, dispatch

    def completed(self) -> dict:
        return store_completed(self.fmt, self.label)

    def cleanup_partial(self) -> None:
        """Nothing now: a redone shard's objects have its names; Lance's leftovers go in the finish task."""

    def write_shard(self, *args: Any) -> Any:
        return self.dispatch.submit(self, *args)


class RayStoreEngine(RayEngine):
    """``RayEngine`` for an ``s3://`` store: ``write_to`` names the driver's staging root and the store."""

    def write_to(self, staging: Path, store: Location) -> None:
        self.staging, self.store = Path(staging), store

    def ingest_split(self, name: str, source: Any, writers: dict[str, Any], eot: int, dtype: str,
                     shard_tokens: int, show_progress: bool, provenance: Any = None) -> tuple[dict, SplitReport]:
        plan = self.store / PLAN_NAME
        if not plan.exists():  # first: it marks the prefix as an interrupted ingest of ours
            plan.upload(self.staging / PLAN_NAME)
        fmts = {f: self.store / Path(w.format_dir).relative_to(self.staging).as_posix() for f, w in writers.items()}
        try:
            return store_split(self, name, source, fmts, eot, dtype, shard_tokens, show_progress, provenance)
        except Exception as exc:
            cause = _lmdata_cause(exc)
            if cause is None:
                raise
            raise type(cause)(str(cause).split("\n", 1)[0]) from None


def _encoded_refs(engine: RayEngine, spec: Any, window: tuple, eot: int, dtype: str) -> Iterator[tuple[dict, Any]]:
    """(counts, tokens ref) of each batch of the split's window, in input order; counts checked."""
    ray = require_ray()
    aws, depth = aws_environment(), 2 * engine.cpus + 2
    files = expand(spec.paths)
    firsts = _document_offsets(spec, files, window != (0, 0, None))
    # SPREAD: encoding is CPU-bound and a text batch is small beside its encoding cost, so the
    # batches go round the nodes; under DEFAULT, locality kept them all on the node that read the
    # file. The write tasks keep DEFAULT: they follow their tokens (no transfer between nodes).
    read = ray.remote(num_cpus=0, max_retries=MAX_RETRIES, scheduling_strategy="SPREAD")(_read_stream).options(
        num_returns="streaming", _generator_backpressure_num_objects=depth)
    enc = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, scheduling_strategy="SPREAD")(_encode_batch).options(
        num_returns=2)
    pending: deque = deque()
    for i, (path, first) in enumerate(zip(files, firsts)):
        for texts in read.remote(spec, str(path), i, first, window, encode.BATCH_BYTES, aws):
            pending.append(enc.remote(texts, [engine.tokenizer], eot, dtype))
            while len(pending) >= depth:
                yield _counted(*pending.popleft())
    while pending:
        yield _counted(*pending.popleft())


def _counted(meta_ref: Any, tokens_ref: Any) -> tuple[dict, Any]:
    meta = _fetched(require_ray().get(meta_ref))
    lengths = meta["lengths"]
    if (len(lengths), int(lengths.sum())) != (meta["n_docs"], meta["n_tokens"]):
        raise RuntimeError(f"Ray ingest: batch {meta['file']}/{meta['batch']} arrived with other counts than encoded")
    return meta, tokens_ref


def store_split(engine: RayEngine, name: str, source: Any, fmts: dict[str, Location], eot: int, dtype: str,
                shard_tokens: int, show_progress: bool, provenance: Any = None) -> tuple[dict, SplitReport]:
    """``ingest_split`` with every shard written to the store by tasks (``fmts``: each format's prefix)."""
    ray = require_ray()
    t0, report, aws = time.perf_counter(), SplitReport(name), aws_environment()
    dispatch = _StoreDispatch(2 * engine.cpus, dtype, aws)
    proxies = {f: _StoreWriter(f, loc, dispatch) for f, loc in fmts.items()}
    done, prefix = start_split(proxies, provenance)  # type: ignore[arg-type]
    reused = next(iter(prefix.values()))
    skip = sum(s.n_docs for s in reused)
    cutter = _RefCutter(proxies, done, shard_tokens, len(reused), skip, sum(s.n_tokens for s in reused),  # type: ignore[arg-type]
                        provenance)
    docs = tokens = 0
    try:
        with progress_bar(name, source, show_progress) as bar:
            for meta, ref in _encoded_refs(engine, source.spec, (source.start, source.start + skip, source.stop),
                                           eot, dtype):
                cutter.add(_Batch(ref), meta["lengths"], np.frombuffer(meta["origins"], np.int64).reshape(-1, 2))
                report.text_bytes += meta["text_bytes"] + meta["skipped_bytes"]
                report.replaced += meta["replaced"]
                docs, tokens = docs + meta["n_docs"], tokens + meta["n_tokens"]
                bar.update(meta["raw"] + meta["skipped_raw"])
            cutter.flush()
        written = {f: [_fetched(ray.get(s)) if isinstance(s, ray.ObjectRef) else s for s in cutter.written[f]]
                   for f in fmts}
    except Exception:
        dispatch.settle()  # no write task may still be writing when the caller reports the failure
        raise
    shards = {f: prefix[f] + written[f] for f in fmts}
    first = next(iter(shards.values()))  # the ingest's shards (Lance's finish regroups its own)
    finish = ray.remote(max_retries=MAX_RETRIES)(_finish_in_store)
    refs = {}
    for f, loc in fmts.items():
        dispatch.check_counts(f, written[f], docs, tokens)
        last_docs = {s.first_doc + s.n_docs - 1: want[4] for s in shards[f]
                     if (want := dispatch.expected.get((f, int(s.name)))) is not None}
        refs[f] = finish.remote(f, loc.uri, dtype, eot, shards[f], last_docs, aws)
    shards = {f: _fetched(ray.get(ref)) for f, ref in refs.items()}
    report.documents, report.tokens = sum(s.n_docs for s in first), sum(s.n_tokens for s in first)
    report.shards, report.reused_shards = len(first), len(reused)
    report.seconds = time.perf_counter() - t0
    return shards, report
