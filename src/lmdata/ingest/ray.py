"""The Ray engine of ``lmdata ingest``: the same store as the local engine, from a cluster.

    input files ──Ray Data read tasks (one per file, streaming)──▶ document batches keyed (file, batch)
        ──Ray Data encode tasks (tokenizer shipped once: one object in the object store)──▶ token batches
        ──driver: restore key order, check counts──▶ the shared ``ShardCutter`` (``shards.py``) (same cut points)
        ──per shard and format, a Ray task runs ``Writer.write_shard``──▶ ShardInfo
        ──driver: shard counts == the encode tasks' counts; ``Writer.finish`` (Lance: one commit);
          committed data read back at every shard's last document; then (in ``ingest``) the manifest

Why it equals the local store: documents come from the same readers (``sources``), are
encoded by the same function (``encode.encode_texts``), reach the same ``ShardCutter`` in input
order, and each shard is written by the format's own ``write_shard`` from the same arrays.
Ray Data does not promise order, so every batch carries its key and the driver re-orders
explicitly (``preserve_order`` is also set, which keeps the re-order buffer empty).

Failure: Ray retries a task whose worker dies (``MAX_RETRIES``); bad input raises
``LmdataError`` inside a task, is not retried, and reaches the user unchanged (file, line,
byte offset). A dead driver leaves shard records but no manifest: ``--resume`` continues
with either engine (the ingest plan does not name the engine). A retried write leaves its
first attempt's files behind; ``cleanup_partial`` removes them before ``finish``.

Cluster use: every node needs lmdata installed. A local store and local inputs must be at the
same paths on every node (a shared filesystem): read and write tasks open them by path. With
``s3://`` inputs and store no filesystem is shared: the tasks write the store (``ray_store``).
Fault injection for tests: with ``LMDATA_RAY_FAULTS=DIR``, a task whose key names a file
``DIR/<key>`` renames it to ``<key>.fired`` and kills its worker once (keys:
``encode-<file>-<batch>``, ``write-<format>-<shard>``, ``wrote-<format>-<shard>``). A file
``DIR/hold`` naming a node's ``LMDATA_CACHE_DIR`` keeps that node's store writes waiting (after
touching ``DIR/held``) until it is removed, so a test can act while one is surely in progress.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import LmdataError
from lmdata.ingest import encode
from lmdata.ingest.output import ResumableError
from lmdata.ingest.ray_reaper import Reaper, ray_processes
from lmdata.ingest.shards import ShardCutter, SplitReport, progress_bar, start_split
from lmdata.sources import SourceSpec, SourceStats, describe, expand, iter_documents
from lmdata.store.protocol import FormatWriter
from lmdata.io.location import location
from lmdata.io.s3 import apply_aws_environment, aws_environment

# Write tasks are retried this often when their worker dies; Ray Data's read and encode
# tasks keep Ray Data's own default (retried on worker death without limit). Exceptions
# raised by our code are bad input (LmdataError) and are never retried.
MAX_RETRIES = 3
FAULTS_ENV = "LMDATA_RAY_FAULTS"


def require_ray() -> Any:
    """The ``ray`` module, or an error saying how to install it."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise LmdataError("--engine ray needs Ray Data; install it with: pip install 'lmdata[ray]'") from None
    return ray


def _maybe_fault(key: str) -> None:
    """Kill this worker once if a test armed ``key`` (see the module docstring)."""
    root = os.environ.get(FAULTS_ENV)
    if not root:
        return
    armed = Path(root) / key
    try:
        os.rename(armed, armed.with_name(key + ".fired"))  # atomic: exactly one attempt fires
    except FileNotFoundError:
        return
    os._exit(1)


def _maybe_hold() -> None:
    """Wait while a test's ``DIR/hold`` names this node's cache (see the module docstring)."""
    root = os.environ.get(FAULTS_ENV)
    if not root:
        return
    hold = Path(root) / "hold"
    try:
        held = hold.read_text() == os.environ.get("LMDATA_CACHE_DIR")
    except FileNotFoundError:
        return
    if held:
        (Path(root) / "held").touch()
        deadline = time.monotonic() + 120
        while hold.exists() and time.monotonic() < deadline:
            time.sleep(0.05)


# ---------------------------------------------------------------------------- tasks (run on workers)


def _read_file(table: Any, spec: SourceSpec, window: tuple[int, int, int | None], batch_bytes: int,
               aws: dict[str, str]) -> Iterator[Any]:
    """One input file -> rows of document texts, ~``batch_bytes`` each, keyed (file, batch).

    ``window = (keep_from, skip_to, stop)`` in global document ids: documents before
    ``keep_from`` are read only; ``[keep_from, skip_to)`` are counted (their bytes), not
    encoded (resume); reading stops at ``stop`` -- as ``islice`` does in the local engine.
    """
    import pyarrow as pa

    apply_aws_environment(aws)  # an s3:// input: the driver's endpoint and keys, not the worker's own
    (row,) = table.to_pylist()
    keep_from, skip_to, stop = window
    stats, g = SourceStats(), row["first_doc"]
    docs = iter_documents(spec, stats, files=[location(row["path"])], first_source=row["file"])
    texts: list[str] = []
    where: list[int] = []  # each encoded document's (source, offset): its provenance
    batch = raw = skipped_raw = skipped_bytes = 0

    def emit(last: bool) -> Any:
        return pa.table({
            "file": [row["file"]], "batch": [batch], "last": [last], "raw": [raw],
            "texts": pa.array([texts], pa.list_(pa.large_string())), "origins": [encode.origin_array(where).tobytes()],
            "replaced": [stats.replaced if last else 0], "skipped_bytes": [skipped_bytes if last else 0],
            "skipped_raw": [skipped_raw if last else 0],
        })

    while stop is None or g < stop:  # test before reading: the document at `stop` is never decoded
        doc = next(docs, None)
        if doc is None:
            break
        if g >= skip_to:
            texts.append(doc.text)
            where += doc[2:4]
            raw += doc.raw_bytes
        elif g >= keep_from:
            skipped_bytes += len(doc.text.encode("utf-8"))
            skipped_raw += doc.raw_bytes
        g += 1
        if raw >= batch_bytes or len(texts) >= encode.BATCH_DOCS:
            yield emit(False)
            texts, where, raw, batch = [], [], 0, batch + 1
    yield emit(True)


_SHIPPED: dict[str, Any] = {}  # object id -> tokenizer: fetched once per worker process


def _encode_rows(table: Any, shipped: list[Any], eot: int, dtype: str) -> Any:
    """Encode one row of texts with ``encode.encode_texts``; report counts beside the arrays."""
    import pyarrow as pa
    import ray

    ref = shipped[0]
    if ref.hex() not in _SHIPPED:
        _SHIPPED.clear()
        _SHIPPED[ref.hex()] = ray.get(ref)
    encode.use_tokenizer(_SHIPPED[ref.hex()])  # what the local engine's pool initializer does
    (row,) = table.to_pylist()
    _maybe_fault(f"encode-{row['file']}-{row['batch']}")
    tokens, lengths, nbytes = encode.encode_texts(row.pop("texts"), eot, dtype)
    row.update(tokens=tokens.tobytes(), lengths=lengths.tobytes(), n_docs=len(lengths),
               n_tokens=int(lengths.sum()), text_bytes=nbytes)
    return pa.Table.from_pylist([row])


def _count_documents(spec: SourceSpec, path: str, aws: dict[str, str]) -> int:
    apply_aws_environment(aws)
    return sum(1 for _ in iter_documents(spec, files=[location(path)]))


def _describe(path: str, aws: dict[str, str]) -> dict[str, object]:
    apply_aws_environment(aws)
    return describe(location(path))


def _write_shard(writer: FormatWriter, label: str, index: int, tokens: np.ndarray, doc_starts: np.ndarray,
                 first_doc: int, first_token: int) -> Any:
    _maybe_fault(f"write-{label}-{index:05d}")
    shard = writer.write_shard(index, tokens, doc_starts, first_doc, first_token)
    _maybe_fault(f"wrote-{label}-{index:05d}")  # files and record written, result lost
    return shard


# ---------------------------------------------------------------------------- the driver


class RayEngine:
    """A Ray connection plus the shipped tokenizer: the ``ray`` engine of ``ingest.job``.

    Connects to ``address`` (``"auto"``, ``"ray://host:10001"``, ...), or starts a local Ray
    with ``workers`` CPUs; a Ray already initialized in this process is used as is.
    Connecting happens before the store is touched: a bad address leaves nothing behind.
    """

    check_installed = staticmethod(require_ray)  # before any work: a missing Ray is an install hint

    def __init__(self, tokenizer_dir: str | Path, workers: int = 0, address: str | None = None) -> None:
        import logging

        ray = require_ray()
        from lmdata.tokenizer import Tokenizer

        # Quiet: errors reach the user as exceptions (an LmdataError as its one line, anything
        # else with its traceback), not also as Ray Data's logged tracebacks.
        logging.getLogger("ray.data").setLevel(logging.CRITICAL)
        self._started = not ray.is_initialized()
        address = address or os.environ.get("RAY_ADDRESS") or None  # Ray's own variable names a cluster too
        if self._started:
            _check_address(address)
            try:  # no address: a private Ray ("local"), never one that `ray start` left running on this machine
                ray.init(address=address or "local", num_cpus=(workers or None) if address is None else None,
                         include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
            except ConnectionError as exc:
                raise LmdataError(f"--ray-address {address}: cannot connect to Ray ({exc})") from None
        # a private Ray (no address) ends with this process, even a SIGKILLed one (``ray_reaper``)
        self._reaper = Reaper(*(ray_processes() if self._started and address is None else ("", [])))
        self.tokenizer = ray.put(Tokenizer.load(tokenizer_dir))  # once; workers fetch it once each
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))

    def start(self, store_tokenizer: Path, tokenizer: Any = None) -> None:
        """Nothing to do: the tokenizer was shipped on connecting."""

    def describe_all(self, files: list[Any]) -> list[dict[str, object]]:
        """The plan's record of each input file (size, checksum), hashed in a task per file where
        the file is read: the driver never reads the input (``output.make_plan``)."""
        ray = require_ray()
        task = ray.remote(max_retries=MAX_RETRIES)(_describe)
        try:
            records = ray.get([task.remote(str(f), aws_environment()) for f in files])
        except Exception as exc:
            cause = _lmdata_cause(exc)
            if cause is None:
                raise
            raise type(cause)(str(cause).split("\n", 1)[0]) from None  # the task's one line, not Ray's wrapper
        return [{**r, "path": str(f)} for f, r in zip(files, records)]

    def stop(self) -> None:
        if self._started:
            require_ray().shutdown()
            self._started = False
            self._reaper.stop()

    def ingest_split(self, name: str, source: Any, writers: dict[str, Any], eot: int, dtype: str,
                     shard_tokens: int, show_progress: bool, provenance: Any = None) -> tuple[dict, SplitReport]:
        return ingest_split(name, source, writers, self, eot, dtype, shard_tokens, show_progress, provenance)


def _check_address(address: str | None) -> None:
    """Fail fast on a ``host:port`` nobody listens on (``ray.init`` would retry for minutes)."""
    import socket

    if not address or address == "local":
        return
    given = address
    if address == "auto":  # what Ray resolves it to (this machine's running cluster), probed like any other
        try:
            from ray._private.services import canonicalize_bootstrap_address

            address = canonicalize_bootstrap_address("auto")
        except ConnectionError:
            raise LmdataError("--ray-address auto: no Ray is running on this machine; start one with `ray start "
                              "--head`, or pass the head's address") from None
        except (ImportError, AttributeError, ValueError):  # (an older Ray, or RAY_ADDRESS a ray:// client address:
            return                                         # ray.init resolves it)
        if not address or address.startswith("ray://"):  # RAY_ADDRESS=local, or a Ray Client: ray.init's
            return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except (OSError, ValueError) as exc:
        shown = given if given == address else f"{given} (Ray resolves it to {address})"  # (auto had hung for good)
        raise LmdataError(f"--ray-address {shown}: no Ray there ({exc}); start one with `ray start --head` "
                          "or pass the address it printed") from None


def _lmdata_cause(exc: BaseException) -> LmdataError | None:
    """The ``LmdataError`` a task raised, under Ray's wrappers (RayTaskError, UserCodeException)."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, LmdataError) and not type(e).__module__.startswith("ray"):  # not Ray's dual-type copy
            return e
        stack += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return None


def _document_offsets(spec: SourceSpec, files: list[Path], needed: bool) -> list[int]:
    """Global id of each file's first document (counted in parallel tasks, only when needed)."""
    if not needed:
        return [0] * len(files)
    ray = require_ray()
    count = ray.remote(max_retries=MAX_RETRIES)(_count_documents)
    counts = ray.get([count.remote(spec, str(p), aws_environment()) for p in files])
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()


def _encoded(engine: RayEngine, spec: SourceSpec, window: tuple[int, int, int | None], eot: int,
             dtype: str) -> Iterator[dict[str, Any]]:
    """Encoded batches of the split's window, in input order, their counts checked."""
    ray = require_ray()
    files = expand(spec.paths)
    firsts = _document_offsets(spec, files, window != (0, 0, None))
    items = [{"file": i, "path": str(p), "first_doc": g} for i, (p, g) in enumerate(zip(files, firsts))]
    ds = (
        ray.data.from_items(items, override_num_blocks=len(items))
        # Reading is ~100x cheaper than encoding: 0 CPUs, so a reader never holds an encoder's
        # core, and one concurrent reader per 16 CPUs (0-CPU tasks are not limited otherwise).
        .map_batches(_read_file, batch_size=1, batch_format="pyarrow", fn_args=(spec, window, encode.BATCH_BYTES, aws_environment()),
                     num_cpus=0, concurrency=-(-engine.cpus // 16))
        .map_batches(_encode_rows, batch_size=1, batch_format="pyarrow", num_cpus=1,
                     fn_args=([engine.tokenizer], eot, dtype))
    )
    ctx = ds.context  # this dataset's own copy: the caller's DataContext stays as it was
    ctx.execution_options.preserve_order = True  # keeps the re-order buffer below empty
    ctx.enable_progress_bars = ctx.print_on_execution_start = False  # our bar counts bytes and tokens
    pending: dict[tuple[int, int], dict[str, Any]] = {}
    key = (0, 0)
    for block in ds.iter_batches(batch_size=None, batch_format="pyarrow", prefetch_batches=2):
        for row in block.to_pylist():
            pending[(row["file"], row["batch"])] = row
        while key in pending:
            row = pending.pop(key)
            yield _checked(row, dtype)
            key = (key[0] + 1, 0) if row["last"] else (key[0], key[1] + 1)
    if pending or key != (len(files), 0):
        raise RuntimeError(f"Ray ingest lost batches: next expected {key}, {len(pending)} out of sequence")


def _checked(row: dict[str, Any], dtype: str) -> dict[str, Any]:
    """Arrays back from bytes; they must hold what the encode task counted."""
    row["tokens"] = np.frombuffer(row["tokens"], dtype=dtype)
    row["lengths"] = np.frombuffer(row["lengths"], dtype=np.int64)
    if (len(row["lengths"]), len(row["tokens"]), int(row["lengths"].sum())) != (
        row["n_docs"], row["n_tokens"], row["n_tokens"]
    ):
        raise RuntimeError(f"Ray ingest: batch {row['file']}/{row['batch']} arrived with other counts than encoded")
    return row


# ---------------------------------------------------------------------------- writing shards in tasks


class _Dispatch:
    """Runs ``write_shard`` as Ray tasks (one per shard and format); bounded shards in flight."""

    def __init__(self, depth: int) -> None:
        ray = require_ray()
        self.task = ray.remote(max_retries=MAX_RETRIES)(_write_shard)
        self.depth = depth
        self.inflight: deque = deque()
        self.last: tuple[Any, ...] = (None, None, None)  # (tokens, tokens ref, doc_starts ref)
        self.expected: dict[tuple[str, int], tuple[int, int, int, int, int]] = {}

    def submit(self, w: "_TaskWriter", index: int, tokens: np.ndarray, doc_starts: np.ndarray,
               first_doc: int, first_token: int) -> Any:
        ray = require_ray()
        if self.last[0] is not tokens:  # the cutter hands every format the same arrays: put them once
            while len(self.inflight) >= self.depth:
                ray.get(self.inflight.popleft())  # back-pressure; raises a failed write early
            self.last = (tokens, ray.put(tokens), ray.put(doc_starts))
        ref = self.task.remote(w.ref, w.label, index, self.last[1], self.last[2], first_doc, first_token)
        self.inflight.append(ref)
        last_doc = int(doc_starts[-1] - doc_starts[-2])
        self.expected[(w.label, index)] = (len(doc_starts) - 1, len(tokens), first_doc, first_token, last_doc)
        return ref

    def settle(self) -> None:
        """Wait for the write tasks still running (their results, errors included, are dropped)."""
        ray = require_ray()
        if self.inflight:
            ray.wait(list(self.inflight), num_returns=len(self.inflight))

    def check_counts(self, label: str, shards: list[Any], docs: int, tokens: int) -> None:
        """The shards cut from encoded batches hold exactly what the encode tasks reported."""
        for s in shards:
            want = self.expected.get((label, int(s.name)), (s.n_docs, s.n_tokens, s.first_doc, s.first_token))[:4]
            if (s.n_docs, s.n_tokens, s.first_doc, s.first_token) != want:
                raise ResumableError(f"{label} shard {s.name}: written with (docs, tokens, first doc, first token) "
                                  f"{(s.n_docs, s.n_tokens, s.first_doc, s.first_token)}, expected {want}; "
                                  "rerun with --resume")
        if (sum(s.n_docs for s in shards), sum(s.n_tokens for s in shards)) != (docs, tokens):
            raise ResumableError(f"{label}: shards hold other document/token counts than encoded ({docs}, {tokens}); "
                              "rerun with --resume")


class _TaskWriter:
    """A format's writer whose ``write_shard`` runs in a task; the rest stays in the driver."""

    def __init__(self, label: str, writer: FormatWriter, dispatch: _Dispatch) -> None:
        self.label, self.writer, self.dispatch = label, writer, dispatch
        self.ref = require_ray().put(writer)  # writers hold paths and a dtype: small

    def completed(self) -> dict:
        return self.writer.completed()

    def cleanup_partial(self) -> None:
        self.writer.cleanup_partial()

    def finish(self, shards: list) -> list | None:
        return self.writer.finish(shards)

    def write_shard(self, index: int, tokens: np.ndarray, doc_starts: np.ndarray, first_doc: int,
                    first_token: int) -> Any:
        return self.dispatch.submit(self, index, tokens, doc_starts, first_doc, first_token)


def check_committed(label: str, writer: FormatWriter, shards: list, last_docs: dict[int, int], dtype: str, eot: int) -> None:
    """Read a committed format back: its size, and each document in ``last_docs`` (a shard's
    last document id -> its length, as encoded), which must end in eot.

    A commit that took a short fragment (the Lance-on-Ray retry failure mode) fails here,
    before any manifest exists.
    """
    from lmdata.store.registry import get_format

    format_dir = writer.format_dir
    reader = get_format(label).reader(format_dir, shards, np.dtype(dtype))
    reader.check()
    for doc_id, want in sorted(last_docs.items()):
        doc = reader.document(doc_id)
        if len(doc) != want or int(doc[-1]) != eot:
            raise ResumableError(f"{format_dir}: committed document {doc_id} (the last of a shard) has {len(doc)} "
                                 f"tokens, expected {want} ending in end-of-text; rerun with --resume")


# ---------------------------------------------------------------------------- one split


def ingest_split(name: str, source: Any, writers: dict[str, Any], engine: RayEngine, eot: int,
                 dtype: str, shard_tokens: int, show_progress: bool, provenance: Any = None) -> tuple[dict, SplitReport]:
    """``LocalEngine.ingest_split`` on Ray: the same arguments, the same result."""
    ray = require_ray()
    t0 = time.perf_counter()
    report = SplitReport(name)
    done, prefix = start_split(writers, provenance)
    reused = next(iter(prefix.values()))
    skip = sum(s.n_docs for s in reused)
    dispatch = _Dispatch(depth=2 * engine.cpus)
    proxies = {fmt: _TaskWriter(fmt, w, dispatch) for fmt, w in writers.items()}
    cutter = ShardCutter(proxies, done, shard_tokens, len(reused), skip, sum(s.n_tokens for s in reused), provenance)
    bar = progress_bar(name, source, show_progress)
    docs = tokens = 0
    try:
        window = (source.start, source.start + skip, source.stop)
        for row in _encoded(engine, source.spec, window, eot, dtype):
            cutter.add(row["tokens"], row["lengths"], np.frombuffer(row["origins"], np.int64).reshape(-1, 2))
            report.text_bytes += row["text_bytes"] + row["skipped_bytes"]
            report.replaced += row["replaced"]
            docs, tokens = docs + row["n_docs"], tokens + row["n_tokens"]
            bar.update(row["raw"] + row["skipped_raw"])
            bar.set_postfix_str(f"{tokens / max(1e-9, time.perf_counter() - t0):,.0f} tokens/s", refresh=False)
        cutter.flush()
        written = {f: [ray.get(s) if isinstance(s, ray.ObjectRef) else s for s in cutter.written[f]] for f in writers}
    except Exception as exc:
        dispatch.settle()  # no write task may still be writing when the caller removes a failed store
        cause = _lmdata_cause(exc)
        if cause is None:
            raise
        # the cause's own type (a NoSpaceError stays one: the job keeps the store for --resume), its first
        # line only: Ray Data appends retry advice after "\n"
        raise type(cause)(str(cause).split("\n", 1)[0]) from None
    finally:
        bar.close()

    shards = {fmt: prefix[fmt] + written[fmt] for fmt in writers}
    first = next(iter(shards.values()))
    for fmt, writer in writers.items():
        dispatch.check_counts(fmt, written[fmt], docs, tokens)
        writer.cleanup_partial()  # what retried writes left: their first attempts' files
        finished = writer.finish(shards[fmt]) or shards[fmt]  # a format may regroup its shards (Lance)
        last_docs = {s.first_doc + s.n_docs - 1: want[4] for s in shards[fmt]
                     if (want := dispatch.expected.get((fmt, int(s.name)))) is not None}
        check_committed(fmt, writer, finished, last_docs, dtype, eot)
        shards[fmt] = finished
    report.documents, report.tokens = sum(s.n_docs for s in first), sum(s.n_tokens for s in first)
    report.shards, report.reused_shards = len(first), len(reused)
    report.seconds = time.perf_counter() - t0
    return shards, report
