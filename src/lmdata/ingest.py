"""The ingest job: sources -> documents -> tokens (in parallel) -> shards in every format.

    documents ──batches──▶ worker pool (encode_ordinary + eot) ──in order──▶ shard cutter
        ──▶ each requested format's Writer, from the same token arrays ──▶ manifest (last)

- Output never depends on the worker count: batches go out and come back in order, and
  shard cut points depend only on the documents' token counts (a shard closes before the
  document that would take it past ``shard_tokens``; a longer document is a shard alone).
- Memory is bounded by the shard size, not the input: the shard being cut, at most two
  shards waiting for their writer threads (``_BackgroundWriter``: one thread per format,
  so tokenizing never waits on a write), and ``2 * workers + 2`` in-flight batches of
  ~1 MB of text (``Pool.imap`` would read the whole input ahead; ``_ordered_map`` does not).
- Documents are encoded with ``encode_ordinary``: a literal ``<|endoftext|>`` inside a
  document is plain text; only this module appends the end-of-text id.
- ``resume`` re-reads the documents of shards every format already completed (cheap: no
  tokenizing) and skips them; later shards are recomputed, so cut points match an
  uninterrupted run. See ``ingest_output`` for the lock, the refusals and the plan check.
- ``engine="ray"`` hands the same splits to ``lmdata.ingest_ray`` (a Ray cluster encodes
  and writes; this module still plans, locks, checks and writes the manifest).
- Before any tokenizing, every source file is hashed once for the manifest and the plan
  (a read at disk speed, small next to tokenizing at a few MB/s per core), and each split
  is checked to hold a document, so bad inputs fail before the store is touched.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmdata import __version__, ingest_output
from lmdata.errors import LmdataError
from lmdata.sources import SourceSpec, SourceStats, SplitSource, expand, iter_documents, kind_of, plan_splits
from lmdata.store.manifest import Manifest, SplitInfo, check_split_name, write_manifest
from lmdata.store.protocol import ShardInfo
from lmdata.store.uri import is_uri

BATCH_BYTES = 1 << 20  # text per task sent to a worker: large enough to amortize pickling
BATCH_DOCS = 4096
DEFAULT_FORMATS = ("memmap", "parquet", "lance")  # the built-ins; plug-in formats only when asked for by name


@dataclass
class SplitReport:
    """The closing summary of one split (``line()`` is what the CLI prints)."""

    name: str
    documents: int = 0
    tokens: int = 0
    text_bytes: int = 0
    replaced: int = 0
    shards: int = 0
    reused_shards: int = 0
    seconds: float = 0.0

    def line(self) -> str:
        bpt = self.text_bytes / max(1, self.tokens - self.documents)
        rate = self.text_bytes / 1e6 / max(self.seconds, 1e-9)
        s = (
            f"{self.name}: {self.documents:,} documents, {self.tokens:,} tokens, {bpt:.2f} bytes/token, "
            f"{self.shards} shards, {self.seconds:.1f} s ({rate:.2f} MB/s)"
        )
        if self.reused_shards:
            s += f" ({self.reused_shards} shards reused from the interrupted run)"
        if self.replaced:
            s += f", {self.replaced:,} invalid UTF-8 sequences replaced by U+FFFD"
        return s


@dataclass
class IngestResult:
    """What ``ingest`` wrote: the manifest and each split's summary."""

    manifest: Manifest
    splits: dict[str, SplitReport] = field(default_factory=dict)


# ---------------------------------------------------------------------------- workers

_TOKENIZER: Any = None


def init_worker(tokenizer_dir: str) -> None:
    """Pool initializer: each worker loads the tokenizer once."""
    from lmdata.tokenizer import Tokenizer

    use_tokenizer(Tokenizer.load(tokenizer_dir))


def use_tokenizer(tokenizer: Any) -> None:
    """The tokenizer ``encode_texts`` uses in this process (another engine's workers set it)."""
    global _TOKENIZER
    _TOKENIZER = tokenizer


def encode_texts(texts: list[str], eot: int, dtype: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Encode a batch: (tokens of all documents, each ending in eot; their lengths; text bytes)."""
    flat: list[int] = []
    lengths = np.empty(len(texts), dtype=np.int64)
    nbytes = 0
    for i, text in enumerate(texts):
        ids = _TOKENIZER.encode_ordinary(text)
        flat.extend(ids)
        flat.append(eot)
        lengths[i] = len(ids) + 1
        nbytes += len(text.encode("utf-8"))
    return np.array(flat, dtype=dtype), lengths, nbytes


def _ordered_map(pool: Any, items: Iterable[tuple], depth: int) -> Iterator[Any]:
    """``pool.imap(encode_texts)`` with at most ``depth`` tasks in flight (bounded memory), in order."""
    pending: deque = deque()
    for args in items:
        pending.append(pool.apply_async(encode_texts, args))
        if len(pending) >= depth:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def _batches(docs: Iterable[Any], eot: int, dtype: str, progress: Callable[[int], None]) -> Iterator[tuple]:
    texts: list[str] = []
    size = 0
    for doc in docs:
        texts.append(doc.text)
        size += doc.raw_bytes
        if size >= BATCH_BYTES or len(texts) >= BATCH_DOCS:
            progress(size)
            yield texts, eot, dtype
            texts, size = [], 0
    if texts:
        progress(size)
        yield texts, eot, dtype


# ---------------------------------------------------------------------------- shards


class ShardCutter:
    """Collects encoded documents and hands complete shards to the writers."""

    def __init__(self, writers: dict[str, Any], done: dict[str, dict[int, ShardInfo]], shard_tokens: int,
                 index: int, first_doc: int, first_token: int) -> None:
        self.writers, self.done, self.shard_tokens = writers, done, shard_tokens
        self.index, self.first_doc, self.first_token = index, first_doc, first_token
        self.pieces: list[np.ndarray] = []
        self.lengths: list[int] = []
        self.n = 0
        self.written: dict[str, list[ShardInfo]] = {fmt: [] for fmt in writers}

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        offset = 0
        for length in lengths.tolist():
            if self.n and self.n + length > self.shard_tokens:
                self.flush()
            self.pieces.append(tokens[offset : offset + length])
            self.lengths.append(length)
            self.n += length
            offset += length

    def flush(self) -> None:
        if not self.n:
            return
        tokens = np.concatenate(self.pieces)
        doc_starts = np.zeros(len(self.lengths) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=doc_starts[1:])
        for fmt, writer in self.writers.items():
            have = self.done[fmt].get(self.index)
            if have is not None and (have.n_docs, have.n_tokens, have.first_doc) == (
                len(self.lengths), self.n, self.first_doc
            ):
                self.written[fmt].append(have)  # finished by the interrupted run
            else:
                self.written[fmt].append(writer.write_shard(self.index, tokens, doc_starts, self.first_doc, self.first_token))
        self.index += 1
        self.first_doc += len(self.lengths)
        self.first_token += self.n
        self.pieces, self.lengths, self.n = [], [], 0


class _BackgroundWriter:
    """A format's writer run on its own thread, so tokenizing never waits on a shard write.

    ``write_shard`` returns a Future at once; at most ``depth`` writes are pending per
    format (memory: ``depth`` shards), and a write's error surfaces at the next call or
    in ``results``. Shards are still written in order (one thread per format), and pyarrow,
    Lance, hashing and fsync release the GIL, so formats write in parallel too.
    """

    def __init__(self, writer: Any, depth: int = 2) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.writer, self.depth = writer, depth
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="lmdata-writer")
        self.pending: deque = deque()

    def write_shard(self, *args: Any) -> Any:
        while len(self.pending) >= self.depth:
            self.pending.popleft().result()
        future = self.pool.submit(self.writer.write_shard, *args)
        self.pending.append(future)
        return future

    def close(self) -> None:
        self.pool.shutdown(wait=True)

    @staticmethod
    def results(shards: list[Any]) -> list[ShardInfo]:
        return [s.result() if hasattr(s, "result") else s for s in shards]


def reusable_prefix(done: dict[str, dict[int, ShardInfo]]) -> dict[str, list[ShardInfo]]:
    """Per format, shards 0..k-1 that every format completed with the same counts (else: redo them)."""
    prefix: dict[str, list[ShardInfo]] = {fmt: [] for fmt in done}
    first_doc = first_token = 0
    for index in itertools.count():
        infos = [d.get(index) for d in done.values()]
        if not infos or any(i is None for i in infos):
            break
        key = {(i.n_docs, i.n_tokens, i.first_doc, i.first_token) for i in infos}
        if len(key) != 1 or next(iter(key))[2:] != (first_doc, first_token):
            break
        for fmt, d in done.items():
            prefix[fmt].append(d[index])
        first_doc += infos[0].n_docs
        first_token += infos[0].n_tokens
    return prefix


# ---------------------------------------------------------------------------- one split


def _ingest_split(name: str, source: SplitSource, writers: dict[str, Any], pool: Any, workers: int,
                  eot: int, dtype: str, shard_tokens: int, show_progress: bool) -> tuple[dict, SplitReport]:
    """One split through every writer; returns each format's shards and the split's report."""
    t0 = time.perf_counter()
    done = {fmt: w.completed() for fmt, w in writers.items()}
    for w in writers.values():
        w.cleanup_partial()
    prefix = reusable_prefix(done)
    reused = next(iter(prefix.values()))
    stats, report = SourceStats(), SplitReport(name, reused_shards=len(reused))
    docs = itertools.islice(iter_documents(source.spec, stats), source.start, source.stop)
    background = {fmt: _BackgroundWriter(w) for fmt, w in writers.items()}
    try:
        with progress_bar(name, source, show_progress) as bar:
            for doc in itertools.islice(docs, sum(s.n_docs for s in reused)):  # reused shards: read, not tokenized
                report.text_bytes += len(doc.text.encode("utf-8"))
                bar.update(doc.raw_bytes)
            cutter = ShardCutter(background, done, shard_tokens, len(reused), sum(s.n_docs for s in reused),
                                 sum(s.n_tokens for s in reused))
            batches = _batches(docs, eot, dtype, bar.update)
            encoded = ((encode_texts(*b) for b in batches) if pool is None
                       else _ordered_map(pool, batches, 2 * workers + 2))
            for tokens, lengths, nbytes in encoded:
                cutter.add(tokens, lengths)
                report.text_bytes += nbytes
                report.tokens += len(tokens)
                bar.set_postfix_str(f"{report.tokens / (time.perf_counter() - t0):,.0f} tokens/s", refresh=False)
            cutter.flush()
        shards = {fmt: prefix[fmt] + _BackgroundWriter.results(cutter.written[fmt]) for fmt in writers}
    finally:
        for w in background.values():
            w.close()
    first = next(iter(shards.values()))
    report.documents, report.tokens = sum(s.n_docs for s in first), sum(s.n_tokens for s in first)
    report.shards, report.replaced = len(first), stats.replaced
    for fmt, writer in writers.items():
        shards[fmt] = writer.finish(shards[fmt]) or shards[fmt]  # a format may regroup its shards (Lance)
    report.seconds = time.perf_counter() - t0
    return shards, report


def progress_bar(name: str, source: SplitSource, show: bool) -> Any:
    """tqdm in bytes of input (so it shows MB/s); tokens/s goes in its postfix."""
    from tqdm import tqdm

    return tqdm(desc=f"ingest {name}", unit="B", unit_scale=True, disable=not show, file=sys.stderr,
                mininterval=0.5, dynamic_ncols=True, total=_known_size(source))


def _known_size(source: SplitSource) -> int | None:
    """Input bytes the progress bar will count, when that is knowable up front."""
    files = expand(source.spec.paths)
    if source.start or source.stop is not None or any(kind_of(f, source.spec.kind) == "parquet" or
                                                        f.suffix in (".gz", ".zst") for f in files):
        return None
    return sum(f.stat().st_size for f in files)


# ---------------------------------------------------------------------------- the job


def _load_tokenizer(tokenizer_dir: Path) -> Any:
    from lmdata.tokenizer import Tokenizer

    if not Path(tokenizer_dir).is_dir():
        raise LmdataError(f"tokenizer {tokenizer_dir}: no such directory; train one with `lmdata tokenizer train`")
    return Tokenizer.load(tokenizer_dir)


def _vocab_size(tok: Any) -> tuple[int, int]:
    """(number of ids, largest id + 1): the dtype must hold the largest id, not just the count."""
    size = int(getattr(tok, "vocab_size", None) or len(tok.vocab))
    vocab = getattr(tok, "vocab", None)
    return size, max(size, max(vocab) + 1 if vocab else 0)


def _writer_classes(formats: Iterable[str]) -> dict[str, Any]:
    from lmdata.store.registry import get_format

    return {fmt: get_format(fmt).writer for fmt in formats}


def ingest(splits: dict[str, SourceSpec], tokenizer_dir: str | Path, out: str | Path, *,
           formats: Iterable[str] | None = None, shard_tokens: int = 1 << 20, workers: int = 0,
           resume: bool = False, overwrite: bool = False, holdout: tuple[str, str, int] | None = None,
           progress: bool = True, log: Callable[[str], None] | None = print, engine: str = "local",
           ray_address: str | None = None) -> IngestResult:
    """Tokenize ``splits`` into a store at ``out`` in every format of ``formats``; manifest last.

    ``formats`` defaults to the built-ins (``DEFAULT_FORMATS``), never to plug-ins.
    ``engine="ray"`` runs the same job on Ray (``lmdata.ingest_ray``, at ``ray_address``);
    the store is the same. On bad input found mid-stream, a store this run started from
    nothing is removed again (see ``ingest_output``).
    """
    if engine not in ("local", "ray"):
        raise LmdataError(f"--engine {engine!r}: choose local or ray")
    if is_uri(out):  # object storage: build in a local staging directory, upload, manifest last
        from lmdata.store.publish import ingest_remote

        return ingest_remote(ingest, out, resume=resume, overwrite=overwrite, log=log, splits=splits,
                             tokenizer_dir=tokenizer_dir, formats=formats, shard_tokens=shard_tokens,
                             workers=workers, holdout=holdout, progress=progress, engine=engine,
                             ray_address=ray_address)
    if engine == "ray":
        from lmdata.ingest_ray import require_ray

        require_ray()  # before any work: a missing Ray is an install hint, not a half store
    formats = list(dict.fromkeys(DEFAULT_FORMATS if formats is None else formats))
    if not formats:
        raise LmdataError("--format names no format; pass e.g. --format memmap,parquet,lance")
    writer_classes = _writer_classes(formats)  # unknown format names fail before any work
    if shard_tokens < 1:
        raise LmdataError(f"--shard-tokens must be positive, got {shard_tokens}")
    if not splits:
        raise LmdataError("no input given; pass --input PATH or --split NAME=PATH")
    for name in [*splits, *([holdout[1]] if holdout else [])]:  # a split is a directory of the store
        check_split_name(name, "--split" if name in splits else "--holdout split")
    for name, spec in splits.items():  # missing files, empty globs: before the store is touched
        expand(spec.paths)
        if next(iter_documents(spec), None) is None:
            raise LmdataError(f"split {name!r}: the input holds no documents ({', '.join(spec.paths)})")
    plan = plan_splits(splits, holdout)
    tokenizer_dir = Path(tokenizer_dir)
    tok = _load_tokenizer(tokenizer_dir)
    if tok.eot_id is None:
        raise LmdataError(f"tokenizer {tokenizer_dir} has no <|endoftext|> special token; retrain it with one")
    (vocab_size, id_limit), eot = _vocab_size(tok), int(tok.eot_id)
    dtype = "uint16" if id_limit <= 1 << 16 else "uint32"
    workers = workers or os.cpu_count() or 1

    tok_files = ingest_output.read_tokenizer_files(tokenizer_dir)
    pool, run_split = None, _ingest_split
    try:
        if engine == "ray":  # connect before the store is touched: a bad --ray-address leaves nothing behind
            from lmdata import ingest_ray

            pool, run_split = ingest_ray.RayEngine(ray_address, str(tokenizer_dir), workers), ingest_ray.ingest_split
        created = ingest_output.missing_root(Path(out))
        out = ingest_output.open_output(Path(out))
        lock = ingest_output.claim(out, resume=resume, overwrite=overwrite)
        fresh = writing = False
        try:
            fresh = ingest_output.is_empty(out)  # started from nothing: a failure on bad input undoes it all
            store_tok = ingest_output.install_tokenizer(out, tokenizer_dir, tok_files, tok.hash, type(tok).load)
            plan_json = ingest_output.make_plan(plan, tok.hash, dtype, shard_tokens, formats)
            ingest_output.check_plan(out, plan_json)
            manifest = Manifest(tok.hash, vocab_size, dtype, eot, shard_tokens, lmdata_version=__version__)
            result = IngestResult(manifest)
            if pool is None:
                pool = _local_pool(store_tok, workers)
            writing = True
            for name, source in plan.items():
                writers = {fmt: cls(out / name / fmt, np.dtype(dtype)) for fmt, cls in writer_classes.items()}
                shards, report = run_split(name, source, writers, pool, workers, eot, dtype, shard_tokens, progress)
                sources = plan_json["splits"][name]["sources"]
                manifest.splits[name] = SplitInfo(report.documents, report.tokens, sources, shards)
                result.splits[name] = report
                if log:
                    log(report.line())
            manifest.extra["splits"] = {
                n: {"text_bytes": r.text_bytes, "replaced": r.replaced} for n, r in result.splits.items()
            }
            write_manifest(out, manifest)
            return result
        except LmdataError as exc:
            if isinstance(exc, ingest_output.ResumableError) or not (fresh or writing):
                raise
            if fresh:
                pool = _stop(pool)  # its workers read the store's tokenizer copy
                ingest_output.remove_output(out, created)
                raise
            raise LmdataError(f"{exc}; then rerun with --overwrite: {out} was started from this input, "
                              "so --resume cannot continue it once the input is fixed") from None
        finally:
            lock.close()
    finally:
        _stop(pool)


def _stop(pool: Any) -> None:
    """Terminate the local pool or the Ray engine (``ingest`` holds either as ``pool``)."""
    if pool is not None:
        pool.terminate()
        pool.join()


def _local_pool(tokenizer_dir: Path, workers: int) -> Any:
    """The processes that encode (None: this one, with ``workers == 1``); the caller terminates it."""
    if workers == 1:
        init_worker(str(tokenizer_dir))
        return None
    # forkserver, not fork: the main process may hold Lance/Arrow threads, which fork does not survive
    return mp.get_context("forkserver").Pool(workers, init_worker, (str(tokenizer_dir),))
