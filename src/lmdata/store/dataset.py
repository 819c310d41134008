"""TokenDataset: a split's token stream cut into training windows, the same for every format.

Sample ``k`` is the slice ``[k*L, k*L + L + 1)`` of the stream (inputs are its first ``L``
ids, targets its last ``L``); there are ``(n_tokens - 1) // L`` samples. A format's reader
only answers "give me the windows at these offsets"; everything else lives here, so one
class serves memmap, Parquet and Lance alike (and any third-party format).

The dataset holds the reader (which holds paths, not open files), so it pickles small to
spawn/forkserver workers. ``__getitems__`` reads a whole batch with one ``reader.windows``
call; torch's DataLoader calls it once per batch. ``batch(indices, dtype=...)`` is the same
read in another dtype: the loader asks for the store's own (``token_dtype``, uint16 for a
GPT-2 vocab) so a worker hands over a quarter of the bytes, and widens in the main process.

Optional per-sample document information, computed from the window itself (a window does
not know where its first document began, so counting starts at the window's start):
``doc_info="positions"`` gives position ids that restart at 0 after every end-of-text,
``doc_info="doc_ids"`` gives 0, 1, 2, ... for the documents the inputs touch.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from lmdata._whole import whole
from lmdata.errors import LmdataError
from lmdata.io.s3 import EndpointError
from lmdata.store.protocol import FormatReader

DOC_INFO = (None, "positions", "doc_ids")


def doc_positions(inputs: np.ndarray, eot_id: int) -> np.ndarray:
    """Position ids ``[B, L]`` that restart at 0 right after each ``eot_id``.

    >>> doc_positions(np.array([[5, 9, 6, 9, 7]]), eot_id=9).tolist()
    [[0, 1, 0, 1, 0]]
    """
    B, L = inputs.shape
    col = np.arange(L, dtype=np.int64)
    restart = np.zeros((B, L), dtype=np.int64)
    restart[:, 1:] = np.where(inputs[:, :-1] == eot_id, col[1:], 0)
    return col - np.maximum.accumulate(restart, axis=1)


def doc_ids(inputs: np.ndarray, eot_id: int) -> np.ndarray:
    """Document ids ``[B, L]`` local to each window: +1 after each ``eot_id``.

    >>> doc_ids(np.array([[5, 9, 6, 9, 7]]), eot_id=9).tolist()
    [[0, 0, 1, 1, 2]]
    """
    out = np.zeros(inputs.shape, dtype=np.int64)
    np.cumsum(inputs[:, :-1] == eot_id, axis=1, out=out[:, 1:])
    return out


class TokenDataset:
    """Map-style dataset of ``L + 1``-token windows over one split (see the module doc)."""

    def __init__(self, reader: FormatReader, seq_len: int, *, doc_info: str | None = None, eot_id: int | None = None) -> None:
        if not whole(seq_len, 1):
            raise LmdataError(f"seq_len must be a whole number >= 1, got {seq_len!r}")  # 10.5 had read 10 windows
        if doc_info not in DOC_INFO:
            raise LmdataError(f"doc_info must be one of {DOC_INFO}, got {doc_info!r}")
        if doc_info is not None and eot_id is None:
            raise LmdataError(f"doc_info={doc_info!r} needs eot_id (the store's manifest records it)")
        self.reader = reader
        self.seq_len = int(seq_len)
        self.doc_info = doc_info
        self.eot_id = None if eot_id is None else int(eot_id)
        self.n_tokens = int(reader.n_tokens)
        self.token_dtype = np.dtype(getattr(reader, "dtype", np.int64))  # holds every id of the split
        self._len = (self.n_tokens - 1) // self.seq_len
        if self._len < 1:
            raise LmdataError(
                f"seq_len {self.seq_len} is too long for this split ({self.n_tokens} tokens): "
                f"a sample needs seq_len + 1 tokens; use seq_len <= {max(self.n_tokens - 1, 0)}"
            )

    def __len__(self) -> int:
        return self._len

    def identity(self) -> str:
        """What a loader state records of its data (format-independent: every format holds the same stream)."""
        return f"{self.n_tokens} tokens as windows of {self.seq_len}"

    @property
    def fork_safe(self) -> bool:
        """False when the reader's library breaks in a forked child (the loader then uses forkserver)."""
        return bool(getattr(self.reader, "fork_safe", True))

    def __repr__(self) -> str:
        return f"TokenDataset({self.reader!r}, seq_len={self.seq_len}, samples={self._len}, doc_info={self.doc_info!r})"

    def _indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        raw = np.asarray(indices)
        if raw.size and raw.dtype.kind not in "iu":  # 1.5 and "3" had been read as 1 and 3
            raise IndexError(f"sample indices must be integers, got {raw.reshape(-1).tolist()[:8]}")
        idx = raw.astype(np.int64, copy=False).reshape(-1)
        idx = np.where(idx < 0, idx + self._len, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= self._len):
            raise IndexError(f"sample index out of range [0, {self._len}): {np.asarray(indices).tolist()[:8]}")
        return idx

    def __getitem__(self, k: int) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Window ``k``: ``L + 1`` int64 ids (plus ``L`` doc-info ids when requested)."""
        out = self.__getitems__([k])
        return (out[0][0], out[1][0]) if isinstance(out, tuple) else out[0]

    def __getitems__(self, indices: Sequence[int]) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """A batch: windows ``[B, L + 1]`` (and doc info ``[B, L]``), one reader call."""
        return self.batch(indices)

    def batch(self, indices: Sequence[int], dtype: Any = np.int64) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """``__getitems__`` with windows in ``dtype`` (doc info in int32 unless ``dtype`` is int64)."""
        idx = self._indices(indices)
        return self.read(idx * self.seq_len, labels=idx, dtype=dtype)

    def check_ahead(self, indices: Sequence[int], offsets: bool = False) -> int:
        """Start getting a later ``batch(indices)`` (``read(indices)`` with ``offsets``) ready on another
        thread: its blocks checked and its windows read (``ShardReader.check_ahead``, whose count it returns)."""
        check = getattr(self.reader, "check_ahead", None)  # (a reader of another package's need not have it)
        if check is None:
            return 0
        starts = np.asarray(indices, dtype=np.int64) if offsets else self._indices(indices) * self.seq_len
        return check(starts, self.seq_len + 1)

    def read(self, starts: np.ndarray, labels: np.ndarray | None = None,
             dtype: Any = np.int64) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Windows of ``L + 1`` ids at arbitrary token offsets (random-offset sampling).

        ``labels`` name the samples in error messages (sample indices; offsets if absent).
        """
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        windows = self._windows(starts, labels).astype(dtype, copy=False)
        if self.doc_info is None:
            return windows
        fn = doc_positions if self.doc_info == "positions" else doc_ids
        info = fn(windows[:, :-1], self.eot_id)
        return windows, info if windows.dtype == np.int64 else info.astype(np.int32)

    def _windows(self, starts: np.ndarray, labels: np.ndarray | None) -> np.ndarray:
        length = self.seq_len + 1
        try:
            out = self.reader.windows(starts, length)
        except Exception as exc:  # name the sample: retry one by one to find the culprit
            raise self._sample_error(starts, labels, exc) from exc
        if out.shape != (len(starts), length):
            raise LmdataError(
                f"{self.reader!r} returned windows of shape {out.shape} for {len(starts)} samples of "
                f"{length} tokens; the reader is broken or a shard is short (run `lmdata verify`)"
            )
        return out

    def _sample_error(self, starts: np.ndarray, labels: np.ndarray | None, exc: Exception) -> LmdataError:
        length = self.seq_len + 1
        what = "sample" if labels is not None else "offset"
        names = labels if labels is not None else starts
        shown = np.asarray(names).tolist()[:8]
        if isinstance(exc, EndpointError):  # the endpoint, not a sample: each retry would wait its timeout again
            return LmdataError(f"reading {what}s {shown}{'...' if len(starts) > 8 else ''}: {exc}")
        for start, name in zip(starts.tolist(), np.asarray(names).tolist()):
            try:
                self.reader.windows(np.array([start], dtype=np.int64), length)
            except Exception as one:
                return LmdataError(f"reading {what} {name} (tokens [{start}, {start + length})): {one}")
        return LmdataError(f"reading {what}s {shown}{'...' if len(starts) > 8 else ''}: {exc}")
