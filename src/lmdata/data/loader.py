"""make_loader: a torch DataLoader over a map-style dataset, deterministic and resumable.

Who decides what (so worker count can never change a rank's batches):

- The main process owns the order. ``EpochSampler`` (a DataLoader ``batch_sampler``)
  computes batch ``b`` of epoch ``e`` for this rank from ``(seed, e, b)`` alone: positions
  ``b*B .. b*B+B-1`` of this rank's share (positions ``i*world_size + rank`` of the epoch,
  the remainder dropped) sent through a keyed ``Permutation`` of all samples. No index
  array is ever built, and resuming at batch ``b`` is O(1): the sampler simply starts there.
- The order is global: position ``p`` of epoch ``e`` is the same sample whatever the
  world size, and the ranks of a W-rank run read positions ``p = i*W + rank``. A resumed
  epoch starts at a global position (``base``, the first not yet read), so a state saved by
  rank 0 of a W-rank run resumes under any W' (elastic resume): every new rank loads that
  one state and together they continue the order, nothing read twice, nothing skipped but
  the remainder a drop-last epoch end drops.
- Workers only read: one ``dataset.batch(indices)`` per batch, in the store's compact dtype;
  the main process widens it into int64 ``(inputs, targets)`` (``collate_windows``).
- ``TokenLoader`` counts the batches *handed to the user*, not those the DataLoader
  prefetched, so ``state_dict()`` after ``k`` batches resumes at batch ``k`` exactly.

``sampling="random"`` is nanoGPT's ``get_batch``: uniform random token offsets, position
``p``'s drawn from ``(seed, epoch, p)`` so it resumes the same way, under any world size; an "epoch" is as many
batches as the shuffled mode has. ``sampling="sequential"`` keeps dataset order
(validation). Iterating a loader runs the rest of the current epoch, then the epoch
counter advances; ``for epoch ...: for inputs, targets in loader:`` is the usual loop.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import warnings
from typing import Any, Iterator

import numpy as np
import torch

from lmdata._mp import can_fork, reimports_unguarded_main
from lmdata._whole import whole
from lmdata.config import BATCHES_PER_READ
from lmdata.data.ahead import LookAhead, check_ahead_on
from lmdata.data.loader_args import check_counts, check_dataset, checked_start_method, rank_and_world
from lmdata.data.mixed import data_identity
from lmdata.data.permutation import Permutation, derive_key, mix64_array
from lmdata.data.workers import (InFlight, ThreadReads, check_workers_while_waiting, defer_sigchld_errors,
                                 exit_with_owner, forks_workers, gc_frozen_for_fork, in_next, worker_deaths,
                                 worker_held)
from lmdata.errors import LmdataError
from lmdata.io import background

SAMPLINGS = ("sequential-shuffle", "random", "sequential")
STATE_VERSION = 2  # 2: + "base" and "position" (global positions; elastic resume). 1 still loads.
BLOCK_BATCHES = 64  # batches whose sample indices are permuted in one call (~0.15 ms -> ~0.01 ms a batch)


class EpochSampler:
    """Batch sampler: yields this rank's index lists of one epoch, from a start batch."""

    def __init__(self, n_samples: int, batch_size: int, *, seed: int, rank: int, world_size: int,
                 sampling: str, drop_last: bool, n_offsets: int = 0, group: int = 1) -> None:
        self.n_samples, self.batch_size, self.seed, self.group = n_samples, batch_size, seed, group
        self.rank, self.world_size, self.sampling = rank, world_size, sampling
        self.drop_last, self.n_offsets = drop_last, n_offsets
        self.epoch, self.start = 0, 0
        self.base = 0  # global position of this epoch's batch 0 (> 0 in an epoch resumed elastically)
        self._perm: tuple[tuple[int, int], Permutation] | None = None  # last (seed, epoch)'s permutation
        self._block: tuple[tuple[int, ...], np.ndarray] | None = None  # last block of permuted indices

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_perm": None, "_block": None}

    def permutation(self, epoch: int) -> Permutation:
        if self._perm is None or self._perm[0] != (self.seed, epoch):
            self._perm = ((self.seed, epoch), Permutation(self.n_samples, self.seed, epoch))
        return self._perm[1]

    @property
    def per_rank(self) -> int:
        """This rank's share of the epoch from ``base``: equal shares, the remainder dropped."""
        return max(self.n_samples - self.base, 0) // self.world_size

    def positions(self, lo: int, hi: int) -> np.ndarray:
        """Global positions of this rank's share entries ``lo .. hi - 1``."""
        return self.base + np.arange(lo, hi, dtype=np.int64) * self.world_size + self.rank

    def position_after(self, batches: int) -> int:
        """The first global position not read once every rank has handed out ``batches`` batches."""
        return self.base + min(batches * self.batch_size, self.per_rank) * self.world_size

    @property
    def batches_per_epoch(self) -> int:
        """This rank's batches in the epoch from ``base`` (an elastically resumed epoch: what is left of it)."""
        full, rest = divmod(self.per_rank, self.batch_size)
        return full + int(rest > 0 and not self.drop_last)

    @property
    def batches_per_full_epoch(self) -> int:
        """This rank's batches in an epoch from its start, whatever ``base`` this one resumed at."""
        full, rest = divmod(self.n_samples // self.world_size, self.batch_size)
        return full + int(rest > 0 and not self.drop_last)

    def batch(self, epoch: int, b: int) -> np.ndarray:
        """Sample indices (token offsets when ``sampling="random"``) of batch ``b``."""
        lo, hi = b * self.batch_size, min((b + 1) * self.batch_size, self.per_rank)
        if self.sampling == "random":  # modulo bias: below n_offsets / 2^64
            return (mix64_array(self.positions(lo, hi), derive_key(self.seed, epoch)) % np.uint64(self.n_offsets)).astype(np.int64)
        if self.sampling == "sequential":
            return self.positions(lo, hi)
        # the permutation's cost is mostly per call (a few NumPy passes of cycle-walking),
        # so the indices of BLOCK_BATCHES batches are computed together and sliced
        block = b // BLOCK_BATCHES
        base = block * BLOCK_BATCHES * self.batch_size
        key = (self.seed, epoch, block, self.base)
        if self._block is None or self._block[0] != key:
            end = min(base + BLOCK_BATCHES * self.batch_size, self.per_rank)
            self._block = (key, self.permutation(epoch)(self.positions(base, end)))
        return self._block[1][lo - base:hi - base]

    def batch_len(self, b: int) -> int:
        return min(self.batch_size, self.per_rank - b * self.batch_size)

    def reads(self) -> Iterator[tuple[int, int]]:
        """(first batch, batches) of each read from batch ``start``: the first read holds one batch, the
        rest ``group`` each. A loader's first batch then waits for one batch's windows, not a group's: on
        object storage, for the shards 32 windows touch instead of 128 (a fresh machine fetches them
        whole; 1,160 shards of 100,000 tokens on moto behind the 20 ms proxy, from the process's start:
        3.7 -> 2.9 s at 0 workers, 5.0 -> 3.0 s at 2; bench/README.md "Peers (remote): shard count")."""
        end, b = self.batches_per_epoch, self.start
        if b < end:
            yield b, 1
        for first in range(b + 1, end, self.group):
            yield first, min(self.group, end - first)

    def __iter__(self) -> Iterator[list[int]]:
        """Index lists of consecutive batches, one list a read (``reads``), from batch ``start``."""
        epoch = self.epoch
        for b, n in self.reads():
            yield np.concatenate([self.batch(epoch, j) for j in range(b, b + n)]).tolist()

    def __len__(self) -> int:
        left = max(self.batches_per_epoch - self.start, 0)
        return 0 if left == 0 else 1 + -(-(left - 1) // self.group)


class CompactBatches:
    """What the DataLoader reads: a batch in the dataset's compact ``token_dtype``, widened later.

    A batch crosses from a worker to the main process as a pickled NumPy array in the
    store's dtype (64 KiB for 32 x 1,025 uint16 ids), and ``collate_windows`` widens it to
    int64 in the main process. Handing over int64 tensors through torch's shared-memory
    path cost ~4x more per batch here (a shared-memory file and a file-descriptor exchange
    per batch; bench/README.md, "Loader"). With ``random=True`` the sampler's "indices"
    are token offsets (``sampling="random"``).
    """

    def __init__(self, dataset: Any, random: bool = False) -> None:
        self.dataset, self.random = dataset, random
        self.dtype = np.dtype(getattr(dataset, "token_dtype", np.int64))

    def __getitems__(self, indices: list[int]) -> Any:
        if self.random:
            return self.dataset.read(np.asarray(indices, dtype=np.int64), dtype=self.dtype)
        if hasattr(self.dataset, "batch"):
            return self.dataset.batch(indices, dtype=self.dtype)
        return self.dataset.__getitems__(indices)

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])

    def check_ahead(self, indices: list[int]) -> int:
        """The blocks of a later ``__getitems__(indices)`` handed to the check-ahead thread (``lmdata.data.ahead``)."""
        return self.dataset.check_ahead(indices, offsets=self.random)


def keep_batch(data: Any) -> Any:
    """The DataLoader's collate: none (the batch is already one array; it is widened in the main process)."""
    return data


def _can_pin() -> bool:
    acc = getattr(torch, "accelerator", None)
    return bool(acc.is_available()) if acc is not None else torch.cuda.is_available()


def collate_windows(data: Any, pin_memory: bool = False) -> tuple[torch.Tensor, ...]:
    """``[B, L + 1]`` windows (and ``[B, L]`` doc info), any integer dtype -> ``(inputs, targets[, info])`` int64.

    The outputs are contiguous ``[B, L]`` slabs of one buffer (one widening copy each),
    in pinned memory when ``pin_memory`` (for ``.to(device, non_blocking=True)``).
    """
    info = None
    if isinstance(data, (tuple, list)):
        data, info = data
    B, L = data.shape[0], data.shape[1] - 1
    out = torch.empty((2 if info is None else 3, B, L), dtype=torch.int64, pin_memory=pin_memory)
    buf = out.numpy()
    buf[0], buf[1] = data[:, :-1], data[:, 1:]
    if info is not None:
        buf[2] = info
    return tuple(out.unbind(0))


class TokenLoader:
    """Iterable of ``(inputs, targets[, info])`` batches with exact mid-epoch resume."""

    def __init__(self, dataset: Any, sampler: EpochSampler, dataloader: torch.utils.data.DataLoader,
                 in_flight: InFlight | None = None, pin_memory: bool = False) -> None:
        self.dataset, self.sampler, self._dl, self._in_flight = dataset, sampler, dataloader, in_flight
        self.pin_memory = pin_memory
        self._epoch, self._batch = 0, 0  # the sampler's base says where batch 0 of this epoch starts
        self.last_batch: tuple[int, int, int] | None = None  # the batch last handed out: ``MixedDataset.sources_of_batch``
        self._stream = 0  # bumped by each iteration started, load_state_dict and set_epoch (``_still_current``)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    def __len__(self) -> int:
        """Batches per epoch for this rank: a whole epoch's, as torch's DataLoader counts them (a resumed epoch
        hands out what is left of it; an elastic resume's had counted only that)."""
        return self.sampler.batches_per_full_epoch

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first batch at the next iteration."""
        if not whole(epoch, 0):  # (2.5 had been epoch 2, None a TypeError)
            raise LmdataError(f"set_epoch({epoch!r}): give a whole number >= 0 (epochs count from 0)")
        self._stream += 1
        self.last_batch = None
        self._next_epoch(int(epoch))

    def _still_current(self, stream: int) -> None:
        """One loader is one stream, its state what it handed out: an iterator resumed after another one
        started, or the state was loaded or the epoch set, would hand out batches that state does not
        count (two ``zip``-ed iterators had each read every other batch, or one batch twice)."""
        if stream != self._stream:
            raise LmdataError("this loader was iterated afresh, or had its state loaded or epoch set, since this "
                              "iterator started: iterate the loader again (one iterator at a time; a loader per "
                              "stream for two)")

    def _next_epoch(self, epoch: int) -> None:
        self._epoch, self._batch, self.sampler.base = epoch, 0, 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        self._stream += 1
        stream = self._stream
        if self._batch and self._batch >= self.sampler.batches_per_epoch:  # left right after an epoch's last batch
            self._next_epoch(self._epoch + 1)
        self.sampler.epoch, self.sampler.start = self._epoch, self._batch
        with warnings.catch_warnings():  # forked only when the dataset said fork is safe (``checked_start_method``)
            warnings.filterwarnings("ignore", message="lance is not fork-safe")
            threads = isinstance(self._dl, ThreadReads)  # reads in this process: nothing forked, nothing to freeze
            workers, context = (0, None) if threads else (self._dl.num_workers, self._dl.multiprocessing_context)
            # forked workers: no background fetch starts until they are made (each fork would wait for one)
            pause = background.paused() if forks_workers(workers, context) else contextlib.nullcontext()
            with gc_frozen_for_fork(workers, context), pause:
                it = iter(self._dl)
        if self._dl.num_workers:
            defer_sigchld_errors()
            check_workers_while_waiting(it)
        while True:
            self._still_current(stream)  # before taking a read: persistent workers' iterator is shared
            try:
                if worker_deaths:  # a worker died while the caller was busy: report it here, with its samples
                    raise worker_deaths.pop()
                in_next.append(True)
                try:
                    group = next(it)
                finally:
                    in_next.pop()
            except StopIteration:
                break
            except Exception as exc:
                worker_deaths.clear()
                raise self._explain(exc, it) from exc
            windows, info = group if isinstance(group, (tuple, list)) else (group, None)
            at = 0
            while at < len(windows):  # the read's batches (``EpochSampler.reads``)
                self._still_current(stream)
                n = self.sampler.batch_len(self._batch)
                if n <= 0:  # more windows than the epoch has batches left: not a read of this sampler
                    break
                part = windows[at:at + n] if info is None else (windows[at:at + n], info[at:at + n])
                at += n
                self._batch += 1  # counts batches handed out, not batches prefetched
                self.last_batch = (self._epoch, self.sampler.base, self._batch - 1)  # (epoch, base, batch)
                yield collate_windows(part, self.pin_memory)
        self._still_current(stream)  # a state loaded after the epoch's last batch is not ended here
        self._next_epoch(self._epoch + 1)

    def _explain(self, exc: Exception, it: Any = None) -> Exception:
        """Worker errors as one LmdataError naming the batch and its samples."""
        text = str(exc)
        if isinstance(exc, LmdataError) and "LmdataError: " in text:  # re-raised from a worker
            return LmdataError(text.rsplit("LmdataError: ", 1)[1].strip() + " (in a DataLoader worker)")
        if isinstance(exc, RuntimeError) and "DataLoader" in text:  # dead worker or timeout
            what = "offsets" if self.sampler.sampling == "random" else "samples"
            busy = self._in_flight.reading() if self._in_flight is not None else {}
            dead, held = self._held(it)
            if dead:
                shown = "; ".join(worker_held(w, busy.get(w, []), held.get(w, []), what) for w in sorted(dead))
            else:
                shown = f"workers were reading {what} " + ("; ".join(map(shown, busy.values())) or "none recorded")
            return LmdataError(
                f"{text.splitlines()[0]} (epoch {self._epoch}, waiting for batch {self._batch}; {shown}; "
                "rerun with num_workers=0 for the full error)"
            )
        return exc

    def _held(self, it: Any) -> tuple[set[int], dict[int, list[int]]]:
        """The dead workers, and the sample indices of every read handed to one and never returned.

        A worker killed between reads (the OOM killer picks its moment) was reading nothing,
        but the reads queued for it die with it: the DataLoader iterator's task table
        (``_task_info``: read number -> (worker,) until its data arrives) names them, and read
        ``k`` of this pass is the sampler's ``k``-th read from ``start`` (``EpochSampler.reads``). Another torch
        without these internals: no dead workers known, and the ``InFlight`` board alone.
        """
        workers, tasks = getattr(it, "_workers", None), getattr(it, "_task_info", None)
        if not workers or not isinstance(tasks, dict):
            return set(), {}
        dead = {w for w, proc in enumerate(workers) if not proc.is_alive()}
        s, held = self.sampler, {}
        for k, info in sorted(tasks.items()):
            if len(info) == 1 and info[0] in dead:
                first, n = next(itertools.islice(s.reads(), k, None), (0, 0))  # read k of this pass
                for b in range(first, first + n):
                    held.setdefault(info[0], []).extend(s.batch(s.epoch, b).tolist())
        return dead, held

    def upcoming(self, skip: int, count: int) -> list[tuple[int, int, np.ndarray]]:
        """(epoch, batch, sample indices) of the ``count`` batches after the next ``skip`` this loader
        would hand out, computed from the order alone: nothing is read and the loader is unchanged.
        ``skip`` may be negative within the current epoch. The way back from a step to its samples."""
        s, base = self.sampler, self.sampler.base
        epoch, batch = self._epoch, self._batch + skip
        if batch < 0:
            raise LmdataError(f"batch {batch} of epoch {epoch}: before this loader's position; use an earlier state")
        out = []
        try:
            while len(out) < count:
                if batch >= s.batches_per_epoch:  # the loader moves on exactly so (``__iter__``)
                    batch, epoch, s.base = batch - s.batches_per_epoch, epoch + 1, 0
                    continue
                out.append((epoch, batch, s.batch(epoch, batch)))
                batch += 1
        finally:
            s.base = base
        return out

    def state_dict(self) -> dict[str, Any]:
        """Where the user is: the next batch to hand out, plus what must match on resume.

        ``position`` is the first global position of epoch ``epoch``'s order not yet read by
        any rank (all ranks hand out batches in step); ``base`` is where this loader's batch 0
        of that epoch started (0 unless the epoch was resumed under another world size or
        batch size); ``batch`` counts this rank's batches since ``base``. So rank ``r`` of
        ``world_size`` reads, as its batch ``b``, positions ``base + (b * batch_size + j) *
        world_size + r`` (``j < batch_size``), sent through the epoch's permutation.
        """
        s = self.sampler
        return {"version": STATE_VERSION, "epoch": self._epoch, "batch": self._batch, "base": s.base,
                "position": s.position_after(self._batch), "seed": s.seed, "sampling": s.sampling,
                "batch_size": s.batch_size, "rank": s.rank, "world_size": s.world_size, "n_samples": s.n_samples,
                "drop_last": s.drop_last, "data": data_identity(self.dataset)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the stored position (O(1): the sampler starts there, nothing is replayed).

        A state of another world size or batch size (elastic resume: any rank's state of the
        old run, usually rank 0's, loaded by every new rank) continues the epoch at its
        global ``position``; the same world size and batch size resume at the stored batch.
        """
        s = self.sampler
        if not isinstance(state, dict):
            raise LmdataError(f"loader state must be the dict state_dict() returned, not {type(state).__name__}")
        version = state.get("version", -1)
        if version not in (1, STATE_VERSION):
            raise LmdataError(
                f"loader state version {version!r} is not {STATE_VERSION}; it was saved by "
                "another lmdata version: resume with that version or start the epoch afresh"
            )
        for key in ("sampling", "n_samples", "drop_last"):
            if key in state and state[key] != getattr(s, key):
                raise LmdataError(
                    f"loader state has {key}={state[key]!r} but this loader has {getattr(s, key)!r}; "
                    f"build the loader with the same {key} to resume"
                )
        if "data" in state and state["data"] != (mine := data_identity(self.dataset)):  # (older states: unchecked)
            raise LmdataError(f"loader state was saved over other data ({state['data']}); this loader reads "
                              f"{mine}: build it over the same split and seq_len (a mixture: the same sources, "
                              "weights and seed)")
        needed = ("epoch", "batch") + (("base", "position") if version != 1 else ())
        if bad := [k for k in needed if not whole(state.get(k), 0)]:
            raise LmdataError(f"loader state: {bad[0]}={state.get(bad[0])!r} (it needs {', '.join(needed)} as whole "
                              "numbers >= 0); load the dict state_dict() returned")
        s.seed = int(state.get("seed", s.seed))  # the state's seed wins: it defines the order resumed
        epoch, batch = int(state["epoch"]), int(state["batch"])
        world, size = int(state.get("world_size", s.world_size)), int(state.get("batch_size", s.batch_size))
        if version == 1:  # batch b of a version-1 state counted from position 0
            base = 0
            position = min(batch * size, s.n_samples // world) * world
        else:
            base, position = int(state["base"]), int(state["position"])
        if not 0 <= base <= position <= s.n_samples:
            raise LmdataError(f"loader state: base {base} / position {position} do not fit {s.n_samples} samples; "
                              "it was not saved by this loader")
        if (world, size) != (s.world_size, s.batch_size):  # elastic: continue the one global order
            base, batch = position, 0
        self._stream += 1  # a live iterator is stale from here (a refused state left it running)
        self.last_batch = None
        self._epoch, self._batch, s.base = epoch, batch, base
        if self._batch >= s.batches_per_epoch:  # saved right after an epoch's last batch, or too little left
            self._next_epoch(self._epoch + 1)


def make_loader(
    dataset: Any,
    batch_size: int,
    *,
    num_workers: int = 0,
    prefetch: int = 2,
    pin_memory: bool = False,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    drop_last: bool = True,
    sampling: str = "sequential-shuffle",
    start_method: str | None = None,
    persistent_workers: bool = True,
    timeout: float = 300.0,
    batches_per_read: int = BATCHES_PER_READ,
) -> TokenLoader:
    """A resumable loader of ``(inputs, targets)`` int64 ``[B, L]`` tensors over ``dataset``.

    ``dataset`` is map-style with ``__getitems__`` (TokenDataset, MixedDataset). ``timeout``
    bounds the wait for one read from a worker, so a stuck read raises instead of hanging.
    ``batches_per_read`` consecutive batches are read with one ``__getitems__`` call (and
    cross from a worker as one array): a read's fixed costs (a Lance ``take``, the
    DataLoader's per-item hand-off) are paid once per group, which made Lance reads
    2-2.5x cheaper per batch here. Batches, their order and ``state_dict`` are the same
    for every value; ``prefetch`` counts reads, so up to ``num_workers * prefetch *
    batches_per_read`` batches wait in memory.
    """
    if sampling not in SAMPLINGS:
        raise LmdataError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
    check_counts(batch_size=(batch_size, 1), num_workers=(num_workers, 0), prefetch=(prefetch, 1),
                 batches_per_read=(batches_per_read, 1), seed=(seed, None))
    check_dataset(dataset)
    rank, world_size = rank_and_world(rank, world_size)
    n_offsets = 0
    if sampling == "random":
        if not hasattr(dataset, "read"):
            raise LmdataError(f"sampling='random' needs a TokenDataset (random token offsets), not {type(dataset).__name__}")
        n_offsets = dataset.n_tokens - dataset.seq_len
    source = CompactBatches(dataset, random=sampling == "random")
    sampler = EpochSampler(len(dataset), batch_size, seed=seed, rank=rank, world_size=world_size,
                           sampling=sampling, drop_last=drop_last, n_offsets=n_offsets, group=batches_per_read)
    if sampler.batches_per_epoch == 0:
        raise LmdataError(
            f"{len(dataset)} samples give rank {rank} of {world_size} no full batch of {batch_size}; "
            "use a smaller batch_size or seq_len, or drop_last=False"
        )
    workers, in_flight = {}, None
    if num_workers > 0:
        start_method = checked_start_method(dataset, start_method)
        if reimports_unguarded_main(start_method):  # spawned workers would re-run the script: fork or threads
            if not (getattr(dataset, "fork_safe", True) and can_fork()):
                return TokenLoader(dataset, sampler, ThreadReads(source, sampler, num_workers, prefetch), None,
                                   pin_memory and _can_pin())
            start_method = "fork"
        if start_method == "forkserver":  # fork workers from a server that already imported torch
            import multiprocessing as mp

            mp.get_context("forkserver").set_forkserver_preload(["torch", "lmdata.data.loader", "lmdata.store.dataset"])
        workers = dict(prefetch_factor=prefetch, persistent_workers=persistent_workers,
                       multiprocessing_context=start_method, timeout=timeout,
                       worker_init_fn=functools.partial(exit_with_owner, os.getpid()))
        source = in_flight = InFlight(source, num_workers, batch_size * batches_per_read, start_method)
    if pin_memory and not _can_pin():
        warnings.warn("pin_memory=True but no accelerator is available; batches are not pinned", stacklevel=2)
        pin_memory = False
    reads: Any = sampler
    if num_workers == 0 and hasattr(dataset, "check_ahead") and check_ahead_on():  # the next reads checked and
        reads = LookAhead(sampler, source.check_ahead)                           # read on a helper thread meanwhile
    dl = torch.utils.data.DataLoader(source, batch_sampler=reads, num_workers=num_workers,
                                     collate_fn=keep_batch, **workers)
    return TokenLoader(dataset, sampler, dl, in_flight, pin_memory)
