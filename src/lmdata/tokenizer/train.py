"""Byte-level BPE training: count pre-tokens in parallel, then merge incrementally.

With the C accelerator (``_fastbpe``, the default where it was built) both halves run in C:
each input (a file or an ``s3://`` object, ``.gz``/``.zst`` decompressed as it streams:
``inputs``) is read in blocks cut where tokenization is unaffected, and threads count
the distinct *chunks* of each block (``ChunkCounter.add``, the encoder's own chunk cutting,
GIL released; one counter per thread, added together at the end); then ``_fastbpe.train``
pre-tokenizes each distinct chunk once and runs the merge loop over the distinct
pre-tokens (pair counts updated only around each merge, a lazily updated max-heap; see
``_fastbpe_train.c``); so is a custom regex the C matcher takes (``regex_program``: its
pre-tokens counted).  Any other regex is counted in Python (below), then merged in C.
Memory: the block reader holds ~2 blocks per thread; the tables grow with the number of
distinct chunks, not with the input (``TrainStats.table_bytes``, ``peak_rss_mb``).

The pure-Python path (no C compiler, or ``LMDATA_PURE_PYTHON=1``) gives the same merges.
Counting streams each input in blocks cut where tokenization is unaffected
(``pretokenize.iter_text_blocks``) and counts each block's pre-tokens in a process pool;
the regex runs once per distinct chunk of a block.  Merging represents every distinct
pre-token as a ``str`` whose characters are token ids (``chr(id)``), so a merge is one
C-speed ``str.replace`` per word that holds the pair; an index pair -> word ids limits
the work to those words, and a heap with lazy re-insertion finds the best pair.  Counts
of existing pairs only ever fall (every new pair contains the newest token), so a
stale heap entry is simply re-pushed with its current count when it surfaces.
"""

from __future__ import annotations

import heapq
import os
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from lmdata._eot import EOT
from lmdata.errors import LmdataError
from lmdata.tokenizer.inputs import Input, check_inputs, stored_bytes
from lmdata.tokenizer.patterns import GPT2, Pattern
from lmdata.tokenizer.pretokenize import ReadStats, count_pretokens, iter_text_blocks, special_splitter

if TYPE_CHECKING:
    from lmdata.io.location import Location

DEFAULT_SPECIAL_TOKENS = (EOT,)
# Blocks the C counter reads: 4 MB ones fragment the heap across threads (0.48 GB input, 2
# threads: peak RSS 611 MB with 4 MB blocks, 118 MB with 256 KB; same CPU time).
C_BLOCK_BYTES = 1 << 18


@dataclass
class TrainStats:
    """The closing summary of a training run."""

    bytes: int = 0
    replacements: int = 0
    distinct_pretokens: int = 0
    merges: int = 0
    seconds: float = 0.0
    distinct_chunks: int = 0
    table_bytes: int = 0  # the C trainer's chunk, pre-token and pair tables at their largest
    peak_rss_mb: float = 0.0  # of this process, when training ended

    def summary(self) -> str:
        """One line for the CLI, e.g. ``22.9 MB, 91,823 distinct pre-tokens, 9,743 merges, 7.1 s, peak RSS 80 MB``."""
        text = (
            f"{self.bytes / 1e6:.1f} MB, {self.distinct_pretokens:,} distinct pre-tokens, "
            f"{self.merges:,} merges, {self.seconds:.1f} s, peak RSS {self.peak_rss_mb:.0f} MB"
        )
        return text + (f", {self.replacements:,} invalid UTF-8 sequences replaced" if self.replacements else "")


def check_special_tokens(special_tokens: list[str] | tuple[str, ...] | None) -> list[str]:
    """Reject empty and duplicate special tokens (they would make ids ambiguous)."""
    tokens = list(special_tokens or [])
    for tok in tokens:
        if not isinstance(tok, str) or not tok:
            raise LmdataError(f"--special-token must be a non-empty string, got {tok!r}")
    dupes = sorted({t for t in tokens if tokens.count(t) > 1})
    if dupes:
        raise LmdataError(f"--special-token {dupes[0]!r} is given more than once; give each once")
    return tokens


def train_bpe(
    input_path: str | Path | Location | list,
    vocab_size: int,
    special_tokens: list[str] | tuple[str, ...] | None = DEFAULT_SPECIAL_TOKENS,
    **opts,
) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Train byte-level BPE on UTF-8 text: files, ``s3://`` objects, globs, ``.gz``/``.zst`` (``inputs``);
    see ``train_bpe_stats`` for ``opts``."""
    vocab, merges, _ = train_bpe_stats(input_path, vocab_size, special_tokens, **opts)
    return vocab, merges


def train_bpe_stats(
    input_path: str | Path | Location | list,
    vocab_size: int,
    special_tokens: list[str] | tuple[str, ...] | None = DEFAULT_SPECIAL_TOKENS,
    *,
    workers: int | None = None,
    errors: str = "strict",
    progress: bool = False,
    block_bytes: int | None = None,
    pattern: str | Pattern | None = None,
    kind: str = "auto",
    text_field: str = "text",
) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]], TrainStats]:
    """Train and also return the run's ``TrainStats``.

    ``workers`` threads (C path; processes on the pure-Python path) count pre-tokens
    (default: all cores; the result never depends on it); ``errors="replace"`` turns invalid UTF-8 into U+FFFD and counts it;
    ``pattern`` is the pre-tokenizer (gpt2, cl100k, o200k or a regex; GPT-2's by default);
    ``block_bytes``: the input is read this much at a time (default: 256 KB on the C path, 4 MB else);
    ``kind`` / ``text_field``: how a JSONL, Parquet or Arrow input yields its documents, as ingest's
    (``tokenizer.inputs``: by the file's name when ``auto``).
    """
    pattern = Pattern.get(pattern)
    start = time.perf_counter()
    specials = check_special_tokens(special_tokens)
    if not isinstance(vocab_size, int) or vocab_size < 256 + len(specials):
        raise LmdataError(
            f"--vocab-size {vocab_size} is too small: it must be at least 256 bytes + "
            f"{len(specials)} special tokens = {256 + len(specials)}"
        )
    if workers is not None and workers < 1:
        raise LmdataError(f"--workers must be at least 1, got {workers}")
    paths = check_inputs(input_path, kind, text_field, specials[0] if specials else "\n\n", errors)
    stats = TrainStats()
    workers = workers or os.cpu_count() or 1
    num_merges = vocab_size - 256 - len(specials)
    fast = fast_module()
    if block_bytes is None:  # C: small blocks keep the heap unfragmented (peak RSS); Python: fewer Counters
        block_bytes = C_BLOCK_BYTES if fast is not None and pattern.c_mode is not None else 4 << 20
    if fast is not None:
        merge_ids = train_fast(fast, paths, specials, workers, errors, stats, progress, block_bytes, pattern,
                               num_merges)
    else:
        counts = count_files(paths, specials, workers, errors, stats, progress, block_bytes, pattern)
        stats.distinct_pretokens = len(counts)
        merge_ids = merge_pairs(counts, num_merges, progress)
    vocab = {i: bytes([i]) for i in range(256)}
    merges = []
    for a, b in merge_ids:
        merges.append((vocab[a], vocab[b]))
        vocab[len(vocab)] = vocab[a] + vocab[b]
    for tok in specials:
        vocab[len(vocab)] = tok.encode("utf-8")
    stats.merges = len(merges)
    stats.seconds = time.perf_counter() - start
    stats.peak_rss_mb = _peak_rss_mb()
    return vocab, merges, stats


def _peak_rss_mb() -> float:
    try:
        import resource
    except ImportError:  # not on Windows
        return 0.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fast_module():
    """The C trainer (``_fastbpe``), or None when it is not built or LMDATA_PURE_PYTHON=1."""
    if os.environ.get("LMDATA_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from lmdata.tokenizer import _fastbpe
    except ImportError:
        return None
    return _fastbpe if hasattr(_fastbpe, "ChunkCounter") else None


def train_fast(
    fast, paths: list[Input], specials: list[str], workers: int, errors: str, stats: TrainStats, progress: bool,
    block_bytes: int, pattern: Pattern, num_merges: int,
) -> list[tuple[int, int]]:
    """Count in C threads (a named pattern, or a regex on the C matcher) or in Python (any other regex),
    then merge in C."""
    if pattern.c_mode is None:
        counts = count_files(paths, specials, workers, errors, stats, progress, block_bytes, pattern)
        merge_ids, stats.distinct_pretokens, stats.table_bytes = fast.train(None, dict(counts), num_merges)
        return merge_ids
    counter = count_chunks(fast, paths, specials, workers, errors, stats, progress, block_bytes, pattern)
    chunk_stats = counter.stats()
    stats.distinct_chunks = chunk_stats["distinct"]
    merge_ids, stats.distinct_pretokens, stats.table_bytes = fast.train(counter, None, num_merges)
    return merge_ids


def count_chunks(
    fast, paths: list[Input], specials: list[str], workers: int, errors: str, stats: TrainStats, progress: bool,
    block_bytes: int, pattern: Pattern,
):
    """The distinct chunks of all files and their counts, in one ``ChunkCounter``.

    The main thread reads and decodes blocks; ``workers`` threads count them in C with the
    GIL released, each into its own counter (taken from a queue, so none is shared), at most
    two blocks per thread in flight.  Counts are sums, so the result never depends on
    ``workers``.
    """
    import queue

    from lmdata.tokenizer import unicode_classes

    unicode_classes.install(fast)
    read = ReadStats()
    workers, bar = _workers_and_bar(paths, workers, block_bytes, progress)
    blocks = (b for p in paths for b in iter_text_blocks(p, specials, read, errors, block_bytes, pattern))
    split = _segments(specials)
    counters = [fast.ChunkCounter(pattern.c_mode, pattern.c_program) for _ in range(workers)]
    free: queue.SimpleQueue = queue.SimpleQueue()
    for c in counters:
        free.put(c)

    def count(block: str) -> None:
        segments = split(block)
        c = free.get()
        try:
            c.add(segments)
        finally:
            free.put(c)

    seen = 0

    def advance() -> None:
        nonlocal seen
        bar.update(read.bytes - seen)
        seen = read.bytes

    _run_bounded(blocks, count, workers, advance)
    advance()
    bar.close()
    stats.bytes, stats.replacements = read.bytes, read.replacements
    for c in counters[1:]:
        counters[0].absorb(c)
    return counters[0]


def count_files(
    paths: list[Input], specials: list[str], workers: int, errors: str, stats: TrainStats, progress: bool,
    block_bytes: int = 4 << 20, pattern: Pattern = GPT2,
) -> Counter:
    """Pre-token frequencies over all files; the same for any ``workers``."""
    read = ReadStats()
    workers, bar = _workers_and_bar(paths, workers, block_bytes, progress)
    blocks = (b for p in paths for b in iter_text_blocks(p, specials, read, errors, block_bytes, pattern))
    count = partial(count_pretokens, special_tokens=specials, pattern=pattern)
    counts: Counter = Counter()
    seen = 0

    def advance() -> None:
        nonlocal seen
        bar.update(read.bytes - seen)
        seen = read.bytes

    if workers == 1:
        for block in blocks:
            counts.update(count(block))
            advance()
    else:
        from lmdata._mp import worker_pool

        with worker_pool(workers) as pool:
            pending: deque = deque()
            for block in blocks:  # at most 2 blocks per worker in flight: bounded memory
                pending.append(pool.apply_async(count, (block,)))
                if len(pending) >= 2 * workers:
                    counts.update(pending.popleft().get())
                advance()
            while pending:
                counts.update(pending.popleft().get())
    advance()
    bar.close()
    stats.bytes, stats.replacements = read.bytes, read.replacements
    return counts


def _workers_and_bar(paths: list[Input], workers: int, block_bytes: int, progress: bool):
    """Workers worth starting (one per block at most: a pool only pays off for several) and the
    "pre-tokenize" bar over text bytes; its total is unknown (none shown) for a compressed input."""
    from lmdata._progress import progress as progress_bar

    stored, total = stored_bytes(paths)  # a compressed input holds at least this many blocks of text
    workers = max(1, min(workers, -(-stored // block_bytes)))
    return workers, progress_bar(progress, total=total, unit="B", unit_scale=True, desc="pre-tokenize")


def _segments(specials: list[str]):
    """``split(block) -> list[str]``: the text between the special tokens of a block."""
    if len(specials) == 1:
        tok = specials[0]
        return lambda block: block.split(tok)  # str.split: C speed
    if specials:
        splitter = special_splitter(specials)
        return lambda block: splitter.split(block)[::2]
    return lambda block: [block]


def _run_bounded(blocks, count, workers: int, advance) -> None:
    """``count(block)`` for every block, on ``workers`` threads, at most 2 blocks per thread in flight."""
    if workers == 1:
        for block in blocks:
            count(block)
            advance()
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers, thread_name_prefix="lmdata-count") as pool:
        pending: deque = deque()
        for block in blocks:  # bounded memory: a few blocks at a time
            pending.append(pool.submit(count, block))
            del block
            if len(pending) >= 2 * workers:
                pending.popleft().result()
            advance()
        while pending:
            pending.popleft().result()


def _inverse_key(token: bytes) -> str:
    """A string that sorts in the *reverse* order of ``token``: a heap min is the greatest token.

    Byte b maps to chr(255 - b); chr(256) ends it so that a prefix sorts after its extensions.
    """
    return "".join(chr(255 - b) for b in token) + chr(256)


def merge_pairs(counts: Counter, num_merges: int, progress: bool = False) -> list[tuple[int, int]]:
    """The BPE merges as (id_a, id_b) pairs; new ids are 256, 257, ... in merge order."""
    from lmdata._progress import progress as progress_bar

    words: list[str] = []
    freqs: list[int] = []
    for tok, n in counts.items():
        w = tok.encode("utf-8").decode("latin-1")  # one char per byte: chr(byte) == token id
        if len(w) > 1:
            words.append(w)
            freqs.append(n)
    pair_counts: dict[str, int] = defaultdict(int)
    where: dict[str, set[int]] = defaultdict(set)
    for wid, w in enumerate(words):
        f = freqs[wid]
        for i in range(len(w) - 1):
            p = w[i : i + 2]
            pair_counts[p] += f
            where[p].add(wid)
    inv = [_inverse_key(bytes([i])) for i in range(256)]
    heap = [(-n, inv[ord(p[0])], inv[ord(p[1])], p) for p, n in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    tokens = [bytes([i]) for i in range(256)]
    for _ in progress_bar(progress, range(num_merges), desc="merge", unit="merge", total=num_merges):
        best = _pop_best(heap, pair_counts, inv)
        if best is None:
            break
        a, b = ord(best[0]), ord(best[1])
        new = len(tokens)
        tokens.append(tokens[a] + tokens[b])
        inv.append(_inverse_key(tokens[new]))
        merges.append((a, b))
        gained = _apply_merge(best, chr(new), words, freqs, pair_counts, where)
        for p in gained:
            heapq.heappush(heap, (-pair_counts[p], inv[ord(p[0])], inv[ord(p[1])], p))
    return merges


def _pop_best(heap: list, pair_counts: dict[str, int], inv: list[str]) -> str | None:
    """Pop the most frequent pair (ties: greatest bytes); stale entries are re-pushed."""
    while heap:
        neg, _, _, p = heap[0]
        n = pair_counts.get(p, 0)
        if n == -neg:
            heapq.heappop(heap)
            return p if n > 0 else None
        if n > 0:
            heapq.heapreplace(heap, (-n, inv[ord(p[0])], inv[ord(p[1])], p))
        else:
            heapq.heappop(heap)
    return None


def _apply_merge(
    pair: str, new: str, words: list[str], freqs: list[int], pair_counts: dict[str, int], where: dict[str, set[int]]
) -> set[str]:
    """Merge ``pair`` -> ``new`` in every word holding it, updating counts only around each merge.

    Returns the pairs it created (they all contain ``new``).
    """
    a, b = pair
    ba = b + a
    gained: set[str] = set()
    for wid in where.pop(pair):
        w = words[wid]
        if pair not in w:
            continue  # stale index entry: an earlier merge consumed the pair here
        nw = w.replace(pair, new)
        words[wid] = nw
        f = freqs[wid]
        last = len(nw) - 1
        j = nw.find(new)
        while j != -1:
            pair_counts[pair] -= f
            if j > 0:
                x = nw[j - 1]
                if x == new:  # "abab" -> "cc": the (b, a) between them is gone; (c, c) counted below
                    pair_counts[ba] -= f
                else:
                    pair_counts[x + a] -= f
                    p = x + new
                    pair_counts[p] += f
                    where[p].add(wid)
                    gained.add(p)
            if j < last:
                y = nw[j + 1]
                p = new + y
                pair_counts[p] += f
                where[p].add(wid)
                gained.add(p)
                if y != new:
                    pair_counts[b + y] -= f
            j = nw.find(new, j + 1)
    del pair_counts[pair]
    return gained
