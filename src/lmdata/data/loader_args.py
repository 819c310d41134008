"""``make_loader``'s arguments checked before anything starts: one line naming the argument.

Counts must be whole numbers (``batch_size=2.5`` had failed deep in torch, ``seed=1.7`` had been
read as 1), the dataset map-style with a length, the rank given with the world size (else every
process would read rank 0's share), and fork turned into forkserver for a dataset that is not
fork-safe.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from lmdata._whole import whole
from lmdata.errors import LmdataError

START_METHODS = (None, "fork", "forkserver", "spawn")


def check_counts(**counts: tuple[Any, int | None]) -> None:
    """Each ``name=(value, least)``: a whole number (not a bool) >= least (None: any)."""
    for name, (value, least) in counts.items():
        if not whole(value, least):
            raise LmdataError(f"make_loader {name}={value!r}: give a whole number" + (f" >= {least}" if least is not None
                                                                                     else ""))


def check_dataset(dataset: Any) -> None:
    """A map-style dataset: a length and ``__getitems__`` or ``batch`` (``TokenDataset``, ``MixedDataset``)."""
    if not (hasattr(dataset, "__len__") and (hasattr(dataset, "__getitems__") or hasattr(dataset, "batch"))):
        raise LmdataError(f"make_loader dataset: {type(dataset).__name__} is not a dataset with __len__ and "
                          "__getitems__; give store.dataset(...) or a MixedDataset")


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values win; else torch.distributed's if initialised; else a single process."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    if rank is None and world_size not in (None, 1):  # every process would read rank 0's share
        raise LmdataError(f"world_size={world_size} without rank: give each process its rank (or start "
                          "torch.distributed first, whose rank is taken)")
    given = {name: (value, 0) for name, value in (("rank", rank), ("world_size", world_size)) if value is not None}
    check_counts(**given)
    rank, world_size = (0 if rank is None else int(rank)), (1 if world_size is None else int(world_size))
    if world_size < 1 or not 0 <= rank < world_size:
        raise LmdataError(f"rank {rank} / world_size {world_size}: need world_size >= 1 and 0 <= rank < world_size")
    return rank, world_size


def checked_start_method(dataset: Any, start_method: str | None) -> str | None:
    """``start_method``, except that fork becomes forkserver for a dataset that is not fork-safe.

    A reader whose library cannot run in a forked child once used in the parent (Lance's
    runtime segfaults there) says ``fork_safe = False`` while that is so; asking for fork then
    would crash workers at random, so the loader forks from a clean server process instead.
    """
    import multiprocessing as mp

    if start_method not in START_METHODS:
        raise LmdataError(f"make_loader start_method={start_method!r}: give one of fork, forkserver, spawn (or None)")
    if getattr(dataset, "fork_safe", True) or (start_method or mp.get_start_method()) != "fork":
        return start_method
    if start_method == "fork":
        warnings.warn(f"{dataset!r} is not fork-safe; using start_method='forkserver' instead of 'fork'", stacklevel=3)
    return "forkserver"
