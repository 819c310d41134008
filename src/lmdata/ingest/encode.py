"""The engine-neutral encoding core: documents -> batches of texts -> token arrays.

Both engines encode with ``encode_texts`` after ``use_tokenizer`` (the local engine sets it
once for its threads, or its process pool's initializer calls ``init_worker``; Ray's tasks
fetch the shipped tokenizer once), so a store does not depend on where it was encoded.
Documents are encoded as ``encode_ordinary`` does: a literal ``<|endoftext|>`` inside a
document is plain text; only the ingest appends the end-of-text id.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

BATCH_BYTES = 1 << 20  # text per task sent to a worker: large enough to amortize pickling
BATCH_DOCS = 4096

_TOKENIZER: Any = None


def init_worker(tokenizer_dir: str) -> Any:
    """Pool initializer: each worker loads the tokenizer once (returned, for the caller)."""
    from lmdata.tokenizer import Tokenizer

    tokenizer = Tokenizer.load(tokenizer_dir)
    use_tokenizer(tokenizer)
    return tokenizer


def use_tokenizer(tokenizer: Any) -> None:
    """The tokenizer ``encode_texts`` uses in this process (another engine's workers set it)."""
    global _TOKENIZER
    _TOKENIZER = tokenizer


def encode_texts(texts: list[str], eot: int, dtype: str) -> tuple[np.ndarray, np.ndarray, int]:
    """Encode a batch: (tokens of all documents, each ending in eot; their lengths; text bytes).

    One ``Tokenizer.encode_arrays`` call: on the C path no Python int is made per token and
    the GIL is released throughout, so the local engine runs these on threads.
    """
    batch = _TOKENIZER.encode_arrays(texts, eot=eot, dtype=dtype, ordinary=True, num_workers=1)
    return batch.tokens, batch.lengths, batch.text_bytes


def batches(docs: Iterable[Any], eot: int, dtype: str, progress: Callable[[int], None],
            origins: deque | None = None) -> Iterator[tuple]:
    """``encode_texts`` arguments of ~``BATCH_BYTES`` of text each; ``progress(raw bytes)`` per batch.

    ``origins``: each batch's ``[n_docs, 2]`` (source, offset) array is appended to it as the
    batch is yielded (the ``ShardCutter``'s provenance; results come back in batch order).
    """
    texts: list[str] = []
    where: list[int] = []  # source, offset, source, offset, ...
    size = 0
    for doc in docs:
        texts.append(doc.text)
        where += doc[2:4]
        size += doc.raw_bytes
        if size >= BATCH_BYTES or len(texts) >= BATCH_DOCS:
            progress(size)
            if origins is not None:
                origins.append(origin_array(where))
            yield texts, eot, dtype
            texts, where, size = [], [], 0
    if texts:
        progress(size)
        if origins is not None:
            origins.append(origin_array(where))
        yield texts, eot, dtype


def origin_array(flat: list[int]) -> np.ndarray:
    """``[source, offset, source, offset, ...]`` -> the ``[n_docs, 2]`` int64 origins of a batch."""
    return np.array(flat, dtype=np.int64).reshape(-1, 2)
