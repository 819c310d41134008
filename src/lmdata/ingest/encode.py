"""The engine-neutral encoding core: documents -> batches of texts -> token arrays.

Both engines encode with ``encode_texts`` after ``use_tokenizer`` (the local pool's
initializer calls ``init_worker``; Ray's tasks fetch the shipped tokenizer once), so a
store does not depend on where it was encoded. Documents are encoded with
``encode_ordinary``: a literal ``<|endoftext|>`` inside a document is plain text; only
the ingest appends the end-of-text id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

BATCH_BYTES = 1 << 20  # text per task sent to a worker: large enough to amortize pickling
BATCH_DOCS = 4096

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


def batches(docs: Iterable[Any], eot: int, dtype: str, progress: Callable[[int], None]) -> Iterator[tuple]:
    """``encode_texts`` arguments of ~``BATCH_BYTES`` of text each; ``progress(raw bytes)`` per batch."""
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
