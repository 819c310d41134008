"""Encoding many texts at once: ``Tokenizer.encode_batch`` (lists) and ``encode_arrays``
(one token array, what ingest writes), on threads where the C encoder releases the GIL.

Threads share the encoder's one chunk cache, so a chunk is encoded once whichever thread
meets it first.  The texts are cut, in order, into many runs of equal characters so both
threads stay busy to the end; results come back in input order, so they never depend on
the number of threads.  Without the C encoder (or for a regex outside the C matcher, whose
pre-tokenizer runs in Python), lists of 8 M characters or more go to a process pool instead.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import TYPE_CHECKING, Any, NamedTuple

from lmdata._mp import worker_pool
from lmdata._whole import whole
from lmdata.errors import LmdataError

if TYPE_CHECKING:
    import numpy as np  # imported where used: `lmdata tokenizer train` needs no NumPy

Tokenizer = Any  # lmdata.tokenizer.encoder.Tokenizer, which imports this module

RUNS_PER_THREAD = 16  # runs of equal counts left one thread a long tail: 0.25 s vs 0.23 s on 2 threads
PROCESS_MIN_CHARS = 8 << 20  # a process pool pays for its pickling only above this
RUN_CHARS = 8 << 20  # encode_arrays encodes at most about this much at a time: its scratch stays small


class EncodedBatch(NamedTuple):
    """Texts encoded into one array: ``tokens[sum(lengths[:i]):][:lengths[i]]`` is text ``i``."""

    tokens: np.ndarray  # uint16 or uint32
    lengths: np.ndarray  # int64, one per text (its end-of-text id included)
    text_bytes: int  # UTF-8 bytes of the texts


def workers_for(n_texts: int, chars: int, num_workers: int | None, min_chars: int) -> int:
    """Threads (or processes) worth using: 1 for few texts or few characters."""
    workers = num_workers or os.cpu_count() or 1
    return 1 if workers == 1 or n_texts < 2 or chars < min_chars else workers


def char_runs(texts: list[str], n: int) -> list[list[str]]:
    """``texts`` cut, in order, into about ``n`` runs of equal characters."""
    target = max(1, sum(map(len, texts)) // n)
    runs, start, size = [], 0, 0
    for i, text in enumerate(texts):
        size += len(text)
        if size >= target:
            runs.append(texts[start : i + 1])
            start, size = i + 1, 0
    if start < len(texts):
        runs.append(texts[start:])
    return runs


def encode_batch(tok: Tokenizer, texts: list[str], num_workers: int | None, min_chars: int) -> list[list[int]]:
    """``[tok.encode(t) for t in texts]`` on threads (C) or processes (big lists, pure Python)."""
    if isinstance(texts, (str, bytes)):  # a str is iterable: it had been encoded as one text per character
        raise LmdataError(f"encode_batch takes a list of texts, not one {type(texts).__name__}; use encode(text)")
    if num_workers is not None and not whole(num_workers, 0):
        raise LmdataError(f"encode_batch num_workers={num_workers!r}: give a whole number >= 1 (0 or None: all cores)")
    chars = sum(map(len, texts))
    workers = workers_for(len(texts), chars, num_workers, min_chars)
    if workers == 1:
        return tok._encode_list(texts)
    if not tok.gil_free:
        if multiprocessing.current_process().daemon or chars < max(min_chars, PROCESS_MIN_CHARS):
            return tok._encode_list(texts)
        with worker_pool(workers) as pool:
            parts = pool.map(tok._encode_list, char_runs(texts, 4 * workers))
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(tok._encode_list, char_runs(texts, RUNS_PER_THREAD * workers)))
    return [ids for part in parts for ids in part]


def encode_arrays(tok: Tokenizer, texts: list[str], eot: int | None, dtype: Any, ordinary: bool,
                  num_workers: int | None, min_chars: int) -> EncodedBatch:
    """All ``texts`` into one token array (each followed by ``eot`` unless None), in order."""
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype not in (np.uint16, np.uint32) or (dtype == np.uint16 and tok.vocab_size > 0x10000):
        raise ValueError(f"dtype {dtype} cannot hold ids up to {tok.vocab_size - 1}; use uint16 (< 65,536) or uint32")
    if eot is not None and not (whole(eot, 0) and eot < tok.vocab_size):  # -1 had meant "no eot" silently
        raise ValueError(f"eot {eot!r} is not an id of this tokenizer (0..{tok.vocab_size - 1}); give one, or None for none")
    chars = sum(map(len, texts))
    workers = workers_for(len(texts), chars, num_workers, min_chars) if tok.gil_free else 1
    runs = char_runs(texts, max(RUNS_PER_THREAD * workers if workers > 1 else 1, chars // RUN_CHARS))
    if len(runs) <= 1:
        return _encode_run(tok, texts, eot, dtype, ordinary)
    out = _InOrder(texts, runs, eot, dtype)

    def place(k: int) -> None:
        out.place(k, _encode_run(tok, runs[k], eot, dtype, ordinary))

    if workers == 1:
        for k in range(len(runs)):
            place(k)
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(place, range(len(runs))))
    return out.result()


class _InOrder:
    """Runs' tokens copied into one array in input order by whichever thread finishes a run,
    while the other threads encode: no final concatenation on the calling thread (a serial
    10 ms of a 0.19 s batch on 2 threads).  The array is allocated for the most ids the
    texts can have (one per UTF-8 byte) and shrunk in place at the end; ``result`` is called
    after every ``place`` has returned."""

    def __init__(self, texts: list[str], runs: list[list[str]], eot: int | None, dtype: np.dtype) -> None:
        import threading

        import numpy as np

        most = sum(len(t) if t.isascii() else 4 * len(t) for t in texts) + (len(texts) if eot is not None else 0)
        self.tokens = np.empty(most, dtype)
        self.lengths = np.empty(len(texts), np.int64)
        self.first_text = np.cumsum([0] + [len(r) for r in runs]).tolist()
        self.lock, self.waiting, self.next, self.filled, self.text_bytes = threading.Lock(), {}, 0, 0, 0

    def place(self, k: int, part: EncodedBatch) -> None:
        """Reserve the place of run ``k`` (and of the finished runs after it) under the lock, copy
        outside it: first writes to fresh memory cost here (1 s of system time per 480 MB), and
        so run in every thread at once."""
        self.lengths[self.first_text[k] : self.first_text[k + 1]] = part.lengths
        copies = []
        with self.lock:
            self.waiting[k] = part
            while self.next in self.waiting:
                ready = self.waiting.pop(self.next)
                copies.append((self.filled, ready.tokens))
                self.filled += len(ready.tokens)
                self.text_bytes += ready.text_bytes
                self.next += 1
        for at, tokens in copies:
            self.tokens[at : at + len(tokens)] = tokens

    def result(self) -> EncodedBatch:
        self.tokens.resize(self.filled, refcheck=False)  # realloc: no copy (ours is the only reference)
        return EncodedBatch(self.tokens, self.lengths, self.text_bytes)


def _encode_run(tok: Tokenizer, texts: list[str], eot: int | None, dtype: np.dtype, ordinary: bool) -> EncodedBatch:
    import numpy as np

    if tok.gil_free:  # one C call: no int objects, the GIL released throughout
        plain = ordinary and tok._fast_plain is not None  # (plain text still holds the non-special added tokens)
        tokens, lengths, nbytes = (tok._fast_plain if plain else tok._fast).encode_flat(
            texts, -1 if eot is None else eot, dtype.itemsize, plain or not ordinary)
        return EncodedBatch(np.frombuffer(tokens, dtype), np.frombuffer(lengths, np.int64), nbytes)
    encode = tok.encode_ordinary if ordinary else tok.encode
    flat: list[int] = []
    lengths = np.empty(len(texts), dtype=np.int64)
    nbytes = 0
    for i, text in enumerate(texts):
        ids = encode(text)
        flat.extend(ids)
        if eot is not None:
            flat.append(eot)
        lengths[i] = len(ids) + (eot is not None)
        nbytes += len(text.encode("utf-8", "surrogatepass"))
    return EncodedBatch(np.array(flat, dtype=dtype), lengths, nbytes)
