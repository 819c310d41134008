"""MixedDataset: several datasets drawn with given weights, as one map-style dataset.

Index ``k`` of the mixture maps, in O(log S) integer arithmetic, to ``(source, j)``, so the
loader's sampler, rank sharding and O(1) resume work unchanged. The schedule is a binary
tree over the sources; at each node a Bresenham/Beatty rule with a seeded phase ``phi``
sends ``k`` left iff ``c(k + 1) > c(k)`` where ``c(k) = (k * A + phi) // D`` and
``A / D`` is the left subtree's share of the weight. The left child sees ``c(k)`` as its
own index, the right child ``k - c(k)``. Every prefix of the schedule holds each source
within ``depth`` samples of its weight (a stratified, low-discrepancy choice), so
proportions converge as 1/k rather than 1/sqrt(k).

Source ``i`` receives ``count_i`` indices ``j``; ``j`` reads sample
``perm_{i, j // len_i}(j % len_i)`` of that source: a source smaller than its share is
repeated (a fresh shuffle per pass), a larger one is subsampled (the same subset each
epoch; raise ``n_samples`` to see more of it).
"""

from __future__ import annotations

import copy
import math
from typing import Any, Sequence

import numpy as np

from lmdata.data.ahead import AHEAD as READS_AHEAD
from lmdata.data.permutation import Permutation, derive_key
from lmdata._whole import whole
from lmdata.errors import LmdataError
from lmdata.store.windows import sorted_unique

_D = 1 << 24  # weight resolution of each tree node


class _Node:
    """A schedule node: a leaf (one source) or a split of weight ``A / D`` to the left."""

    def __init__(self, sources: list[int], weights: list[float], seed: int, path: int = 1) -> None:
        self.leaf = sources[0] if len(sources) == 1 else None
        if self.leaf is not None:
            return
        mid = len(sources) // 2
        wl, wr = sum(weights[:mid]), sum(weights[mid:])
        self.A = min(max(round(wl / (wl + wr) * _D), 1), _D - 1)
        self.phase = derive_key(seed, path) % _D
        self.left = _Node(sources[:mid], weights[:mid], seed, 2 * path)
        self.right = _Node(sources[mid:], weights[mid:], seed, 2 * path + 1)

    def count(self, k: int) -> int:
        return (k * self.A + self.phase) // _D

    def locate(self, k: np.ndarray, src: np.ndarray, local: np.ndarray, at: np.ndarray) -> None:
        """Write source and source-local index of mixture indices ``k`` into ``src[at]``, ``local[at]``."""
        if self.leaf is not None:
            src[at], local[at] = self.leaf, k
            return
        c0 = (k * self.A + self.phase) // _D
        go_left = ((k + 1) * self.A + self.phase) // _D > c0
        self.left.locate(c0[go_left], src, local, at[go_left])
        self.right.locate((k - c0)[~go_left], src, local, at[~go_left])

    def counts(self, n: int, out: list[int]) -> None:
        """How many of the first ``n`` mixture indices each source receives."""
        if self.leaf is not None:
            out[self.leaf] = n
            return
        c = self.count(n)
        self.left.counts(c, out)
        self.right.counts(n - c, out)


def _is_number(value: Any) -> bool:
    """A weight ``float()`` takes as a number (a Decimal, a 0-d tensor too), not by parsing text."""
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def data_identity(dataset: Any) -> str:
    """A dataset's ``identity()``, or its type and length: what a loader state must find again on resume."""
    identity = getattr(dataset, "identity", None)
    return identity() if callable(identity) else f"{type(dataset).__name__} of {len(dataset)} samples"


class MixedDataset:
    """``[(dataset, weight), ...]`` -> one dataset of ``n_samples`` (default: their total)."""

    def __init__(self, sources: Sequence[tuple[Any, float]], seed: int = 0, n_samples: int | None = None) -> None:
        if not sources or not all(isinstance(s, (tuple, list)) and len(s) == 2 for s in sources):
            raise LmdataError("MixedDataset needs (dataset, weight) pairs, e.g. [(a, 0.7), (b, 0.3)]")
        self.datasets = [d for d, _ in sources]
        if bad := [w for _, w in sources if isinstance(w, (bool, str, bytes)) or not _is_number(w)]:
            raise LmdataError(f"MixedDataset weight {bad[0]!r}: give a number")
        self.weights = check_weights([float(w) for _, w in sources], "MixedDataset weights")
        if len(hashes := {getattr(d, "tokenizer_hash", None) for d in self.datasets} - {None}) > 1:
            raise LmdataError(f"MixedDataset sources come from different tokenizers ({', '.join(sorted(hashes))}); "
                              "mix stores ingested with the same tokenizer")
        lens = [len(d) for d in self.datasets]
        shapes = {(getattr(d, "seq_len", None), getattr(d, "doc_info", None)) for d in self.datasets}
        if len(shapes) != 1:
            raise LmdataError(f"MixedDataset sources must share seq_len and doc_info, got {sorted(shapes, key=str)}")
        self.seq_len, self.doc_info = shapes.pop()
        for name, value in (("seed", seed), ("n_samples", n_samples)):
            if value is not None and not whole(value):
                raise LmdataError(f"MixedDataset {name}={value!r}: give a whole number")  # 2.5 had been read as 2
        self.seed = int(seed)
        self.n_samples = int(sum(lens) if n_samples is None else n_samples)
        if not 0 < self.n_samples < (1 << 62) // _D:
            raise LmdataError(f"MixedDataset n_samples must be in [1, {(1 << 62) // _D}), got {self.n_samples}")
        self._tree = _Node(list(range(len(sources))), self.weights, self.seed)
        self.counts = [0] * len(sources)
        self._tree.counts(self.n_samples, self.counts)

    def __len__(self) -> int:
        return self.n_samples

    def identity(self) -> str:
        """What a loader state records of the mixture: its sources, weights, seed and length."""
        parts = "; ".join(f"{data_identity(d)} at {w:g}" for d, w in zip(self.datasets, self.weights))
        return f"mixture of [{parts}], seed {self.seed}, {self.n_samples} samples"

    @property
    def fork_safe(self) -> bool:
        return all(getattr(d, "fork_safe", True) for d in self.datasets)

    def __repr__(self) -> str:
        return f"MixedDataset({len(self.datasets)} sources, weights={self.weights}, n_samples={self.n_samples})"

    def locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(source, index within that source's dataset)`` for each mixture index."""
        k = np.asarray(indices)
        if k.size and k.dtype.kind not in "iu":  # 1.5 had been read as 1
            raise IndexError(f"mixture indices must be integers, got {k.reshape(-1).tolist()[:8]}")
        k = k.astype(np.int64, copy=False).reshape(-1)
        if k.size and (k.min() < 0 or k.max() >= self.n_samples):
            raise IndexError(f"mixture index out of range [0, {self.n_samples})")
        src, local = np.empty_like(k), np.empty_like(k)
        self._tree.locate(k, src, local, np.arange(len(k)))
        for i, d in enumerate(self.datasets):  # local -> sample of source i, shuffled per pass
            sel = np.flatnonzero(src == i)
            if sel.size:
                passes, rest = np.divmod(local[sel], len(d))
                for p in sorted_unique(passes).tolist():
                    at = sel[passes == p]
                    local[at] = self._permutation(i, p)(rest[passes == p])
        return src, local

    def _permutation(self, source: int, epoch: int) -> Permutation:
        """Source ``source``'s shuffle of pass ``epoch``, kept for the next reads (a read meets each
        source's current pass and maybe the next; building one is ~10 us, a read's 128 indices ~2 us)."""
        perms = self.__dict__.setdefault("_perms", {})
        perm = perms.get((source, epoch))
        if perm is None:
            perm = perms[(source, epoch)] = Permutation(len(self.datasets[source]), derive_key(self.seed, source), epoch)
            while len(perms) > 4 * len(self.datasets):
                del perms[next(iter(perms))]
        return perm

    def __getitem__(self, k: int) -> Any:
        out = self.__getitems__([k])
        return (out[0][0], out[1][0]) if isinstance(out, tuple) else out[0]

    @property
    def token_dtype(self) -> np.dtype:
        """A dtype that holds every source's ids (the loader's hand-off dtype)."""
        return np.result_type(*(np.dtype(getattr(d, "token_dtype", np.int64)) for d in self.datasets))

    def __getitems__(self, indices: Sequence[int]) -> Any:
        return self.batch(indices)

    def batch(self, indices: Sequence[int], dtype: Any = np.int64) -> Any:
        """One read per source touched, reassembled in the requested order (windows in ``dtype``)."""
        located = self.__dict__.get("_located")  # from check_ahead, a group of reads early
        found = located.pop(tuple(indices), None) if located else None
        src, local = found if found is not None else self.locate(indices)
        windows = info = None
        if not len(src):
            return np.empty((0, self.seq_len + 1), dtype=dtype)
        for i in sorted_unique(src):
            at = np.flatnonzero(src == i)
            d = self.datasets[i]
            part = d.batch(local[at].tolist(), dtype=dtype) if hasattr(d, "batch") else d.__getitems__(local[at].tolist())
            part_w, part_i = part if isinstance(part, tuple) else (part, None)
            if windows is None:
                windows = np.empty((len(src),) + part_w.shape[1:], dtype=dtype)
                info = None if part_i is None else np.empty((len(src),) + part_i.shape[1:], dtype=part_i.dtype)
            windows[at] = part_w
            if info is not None:
                info[at] = part_i
        return windows if info is None else (windows, info)

    def check_ahead(self, indices: Sequence[int], offsets: bool = False) -> int:
        """Each source's part of a later ``batch(indices)`` handed to that source's ``check_ahead``
        (``lmdata.data.ahead``); the blocks the finished jobs met, summed (-1: none finished)."""
        src, local = self.locate(indices)
        located = self.__dict__.setdefault("_located", {})  # the read of these indices (a few later) reuses it
        located[tuple(indices)] = (src, local)
        while len(located) > READS_AHEAD + 1:
            del located[next(iter(located))]
        found = [d.check_ahead(local[src == i].tolist()) for i in sorted_unique(src).tolist()
                 if hasattr(d := self.datasets[i], "check_ahead")]
        known = [f for f in found if f >= 0]
        return sum(known) if known else -1 if found else 0

    def fractions(self) -> list[float]:
        """Each source's share of the mixture's samples (its weight, to within 1/n_samples)."""
        return [c / self.n_samples for c in self.counts]

    def sources_of_batch(self, loader: Any) -> np.ndarray:
        """Samples per source in the batch ``loader`` (a make_loader over this mixture) last handed out."""
        if getattr(loader, "last_batch", None) is None:  # (the state's batch - 1 had been -1 at an epoch's end)
            raise LmdataError("sources_of_batch: the loader has handed out no batch since it was made, its state "
                              "loaded or its epoch set")
        epoch, base, batch = loader.last_batch
        sampler = copy.copy(loader.sampler)  # at the base that batch was counted from (an elastic epoch's)
        sampler.base = base
        return np.bincount(self.locate(sampler.batch(epoch, batch))[0], minlength=len(self.datasets))


# -- mixtures of store splits, as `lmdata train --mix` and `[train.mix]` name them -------------
#
#     [train.mix.stories]            # one table per source; the name is only a label
#     store = "runs/stories-store"
#     split = "train"                # default "train"
#     weight = 0.7
#
# and on the command line `--mix runs/stories-store:train=0.7 --mix runs/code-store=0.3`.
# A source is the dict {"store": path, "split": name, "weight": float}.


def parse_mix_flag(spec: str) -> dict[str, Any]:
    """``STORE[:SPLIT]=WEIGHT`` -> a source dict; ``s3://b/p:train=1`` keeps the URI's colon."""
    path, eq, weight = spec.rpartition("=")
    if not eq or not path:
        raise LmdataError(f"--mix {spec!r}: expected STORE[:SPLIT]=WEIGHT, e.g. runs/a-store:train=0.7")
    store, colon, split = path.rpartition(":")
    if not colon or not store or "/" in split or split.startswith("\\"):
        store, split = path, "train"
    try:
        w = float(weight)
    except ValueError:
        raise LmdataError(f"--mix {spec!r}: weight {weight!r} is not a number") from None
    return _source(store, split, w, f"--mix {spec!r}")


def parse_mix_table(table: Any, where: str) -> list[dict[str, Any]]:
    """``[train.mix]`` (tables of store, split, weight) -> source dicts, in file order."""
    if not isinstance(table, dict) or not table or not all(isinstance(v, dict) for v in table.values()):
        raise LmdataError(f"{where}: expected tables [train.mix.NAME] with store, split, weight")
    out = []
    for name, entry in table.items():
        unknown = set(entry) - {"store", "split", "weight"}
        if unknown or "store" not in entry or "weight" not in entry:
            raise LmdataError(f"{where}.{name}: needs store and weight (and optionally split), "
                              f"got {', '.join(sorted(entry)) or 'nothing'}")
        w = entry["weight"]
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise LmdataError(f"{where}.{name}.weight: expected a number, got {w!r}")
        out.append(_source(str(entry["store"]), str(entry.get("split", "train")), float(w), f"{where}.{name}"))
    return out


def check_weights(weights: list[float], where: str) -> list[float]:
    """Refuse weights the schedule cannot honour: each finite and > 0, their sum finite, and
    each share at least the tree's resolution (1 in 2**24), which would otherwise round it up."""
    for w in weights:
        if not 0 < w < math.inf:
            raise LmdataError(f"{where}: a weight must be a finite number > 0, got {w}; "
                              "drop a source instead of weighting it 0, and use relative weights such as 0.7 and 0.3")
    total = sum(weights)
    if not total < math.inf:
        raise LmdataError(f"{where}: the weights {weights} sum to infinity; use relative weights such as 0.7 and 0.3")
    if len(weights) > 1 and min(weights) / total < 1 / _D:
        raise LmdataError(f"{where}: weight {min(weights)} is under 1/{_D} of the total {total:g}, finer than the "
                          f"mixture can draw; raise it or drop that source")
    return weights


def _source(store: str, split: str, weight: float, where: str) -> dict[str, Any]:
    check_weights([weight], where)
    return {"store": store, "split": split, "weight": weight}


def open_mix_stores(sources: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Open each source's store; refuse a missing split or a tokenizer other than the first's.

    Returns the sources with ``open`` (the Store) and ``tokenizer_hash`` added.
    """
    from lmdata.store import open_store

    check_weights([float(s["weight"]) for s in sources], "--mix")
    out = []
    for src in sources:
        store = open_store(src["store"])
        if src["split"] not in store.manifest.splits:
            raise LmdataError(f"--mix {src['store']}:{src['split']}: no such split; "
                              f"splits: {', '.join(store.manifest.splits)}")
        out.append({**src, "open": store, "tokenizer_hash": store.manifest.tokenizer_hash})
    first = out[0]
    for src in out[1:]:
        if src["tokenizer_hash"] != first["tokenizer_hash"]:
            raise LmdataError(
                f"--mix: store {src['store']} was ingested with tokenizer {src['tokenizer_hash'][:12]} but "
                f"{first['store']} with {first['tokenizer_hash'][:12]}; ids would mean different text -- "
                "re-ingest one of them with the other's tokenizer"
            )
    return out
