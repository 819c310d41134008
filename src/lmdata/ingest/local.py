"""The local engine: encoder threads (or processes) encode, one thread per format writes.

    documents ──batches──▶ worker pool (encode_texts) ──in order──▶ ShardCutter
        ──▶ each format's writer on its own thread, from the same token arrays

- Memory is bounded by the shard size, not the input: the shard being cut, at most two
  shards waiting for their writer threads (``BackgroundWriter``), and ``2 * workers + 2``
  in-flight batches of ~1 MB of text (``Pool.imap`` would read the whole input ahead;
  ``ordered_map`` does not).
- Batches go out and come back in order, so the store does not depend on ``workers``.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lmdata._mp import clean_method, worker_pool
from lmdata.ingest.encode import batches, encode_texts, init_worker, use_tokenizer
from lmdata.ingest.shards import ShardCutter, SplitReport, progress_bar, start_split
from lmdata.ingest.splits import SplitSource
from lmdata.sources import SourceStats, iter_documents
from lmdata.store.formats.base import RecordedShardWriter
from lmdata.store.protocol import FormatWriter, ShardInfo
from lmdata.store.provenance import ProvenanceWriter


def ordered_map(pool: Any, items: Iterable[tuple], depth: int) -> Iterator[Any]:
    """``pool.imap(encode_texts)`` with at most ``depth`` tasks in flight (bounded memory), in order."""
    pending: deque = deque()
    for args in items:
        pending.append(pool.apply_async(encode_texts, args))
        if len(pending) >= depth:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


class BackgroundWriter:
    """A format's writer run on its own thread, so tokenizing never waits on a shard write.

    ``write_shard`` returns a Future at once; at most ``depth`` writes are pending per
    format (memory: ``depth`` shards), and a write's error surfaces at the next call or
    in ``results``. Shards are still written in order (one thread per format), and pyarrow,
    Lance, hashing and fsync release the GIL, so formats write in parallel too. The thread is
    named for the writer (``lmdata-writer-ParquetWriter_0``), so a profile's per-thread time
    (``py-spy --threads``) tells the formats apart.
    """

    def __init__(self, writer: FormatWriter, depth: int = 2) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.writer, self.depth = writer, depth
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"lmdata-writer-{type(writer).__name__}")
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


class LocalEngine:
    """This machine's cores: a pool of ``workers`` encoders (none for one worker).

    Where the tokenizer encodes in C with the GIL released (``Tokenizer.gil_free``: the C
    accelerator and a named pattern), the pool is threads sharing this process's tokenizer
    and its one chunk cache: no text or token array is pickled, and a chunk is encoded once
    for all workers (bench/ingest.py, english-prose, 2 workers: ``encode`` 0.9 -> 0.6 s wall,
    1.5 -> 0.9 CPU s, peak RSS 259 -> 108 MB; all three formats 2.6 -> 2.1 s).  Otherwise it
    is processes: the pool forks from a clean forkserver where there is one (the main process
    may hold Lance/Arrow threads, which a plain fork does not carry over), spawns on Windows.
    A script without an ``if __name__ == "__main__":`` guard would re-run itself in each such
    worker (``lmdata._mp``), so for it the pool forks directly on Linux (the encoders touch
    no Lance or Arrow) and is a thread pool elsewhere.
    """

    def __init__(self, tokenizer_dir: Path, workers: int, address: str | None = None) -> None:
        self.workers = workers
        self.pool: Any = None

    @staticmethod
    def check_installed() -> None:
        """Nothing beyond lmdata itself is needed."""

    def start(self, store_tokenizer: Path, tokenizer: Any = None) -> None:
        """Start the encoders on the store's copy of the tokenizer (``tokenizer``: the same one,
        already loaded by the caller, so this process need not load it again)."""
        if tokenizer is None:
            tokenizer = init_worker(str(store_tokenizer))
        else:
            use_tokenizer(tokenizer)
        if self.workers == 1:
            return
        if tokenizer.gil_free:
            from multiprocessing.pool import ThreadPool

            self.pool = ThreadPool(self.workers)
            return
        self.pool = worker_pool(self.workers, clean_method(), init_worker, (str(store_tokenizer),))

    def stop(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None

    def ingest_split(self, name: str, source: SplitSource, writers: dict[str, FormatWriter], eot: int,
                     dtype: str, shard_tokens: int, show_progress: bool,
                     provenance: ProvenanceWriter | None = None) -> tuple[dict, SplitReport]:
        """One split through every writer (and each document's origin to ``provenance``);
        returns each format's shards and the split's report."""
        t0 = time.perf_counter()
        done, prefix = start_split(writers, provenance)
        reused = next(iter(prefix.values()))
        stats, report = SourceStats(), SplitReport(name, reused_shards=len(reused))
        docs = itertools.islice(iter_documents(source.spec, stats), source.start, source.stop)
        in_order = [w for w in writers.values() if isinstance(w, RecordedShardWriter)]
        for w in in_order:
            w.write_in_order()  # one BackgroundWriter thread per format, shards in order
        background, written = {fmt: BackgroundWriter(w) for fmt, w in writers.items()}, False
        origin_writer = BackgroundWriter(provenance) if provenance is not None else None  # off the main thread too
        try:
            with progress_bar(name, source, show_progress) as bar:
                for doc in itertools.islice(docs, sum(s.n_docs for s in reused)):  # reused: read, not tokenized
                    report.text_bytes += len(doc.text.encode("utf-8"))
                    bar.update(doc.raw_bytes)
                cutter = ShardCutter(background, done, shard_tokens, len(reused), sum(s.n_docs for s in reused),
                                     sum(s.n_tokens for s in reused), origin_writer)
                origins: deque | None = deque() if provenance is not None else None
                items = batches(docs, eot, dtype, bar.update, origins)
                encoded = ((encode_texts(*b) for b in items) if self.pool is None
                           else ordered_map(self.pool, items, 2 * self.workers + 2))
                for tokens, lengths, nbytes in encoded:
                    cutter.add(tokens, lengths, origins.popleft() if origins is not None else None)
                    report.text_bytes += nbytes
                    report.tokens += len(tokens)
                    bar.set_postfix_str(f"{report.tokens / (time.perf_counter() - t0):,.0f} tokens/s", refresh=False)
                cutter.flush()
            shards = {fmt: prefix[fmt] + BackgroundWriter.results(cutter.written[fmt]) for fmt in writers}
            BackgroundWriter.results(cutter.origins_written)  # its errors, if any
            written = True
        finally:
            for w in [*background.values(), *([origin_writer] if origin_writer else [])]:
                w.close()
            for w in in_order if not written else []:
                w.abandon()
        first = next(iter(shards.values()))
        report.documents, report.tokens = sum(s.n_docs for s in first), sum(s.n_tokens for s in first)
        report.shards, report.replaced = len(first), stats.replaced
        try:
            for fmt, writer in writers.items():
                shards[fmt] = writer.finish(shards[fmt]) or shards[fmt]  # a format may regroup its shards (Lance)
        finally:
            for w in in_order:  # a finish that failed leaves later formats' streams open
                w.abandon()
        report.seconds = time.perf_counter() - t0
        return shards, report
