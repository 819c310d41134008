"""Where training runs: the device, the torchrun process group, and the accelerator's name.

``resolve_device`` is the one place ``--device`` is turned into a torch device (``train``,
``bench`` and ``sample`` all call it); ``init_distributed`` joins torchrun's group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from lmdata.errors import LmdataError


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # train() created the process group, so it tears it down

    @property
    def main(self) -> bool:
        return self.rank == 0


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """auto -> cuda, then mps, then cpu; ``cuda`` -> this rank's GPU, ``cuda:N`` as given; an
    unavailable device is an error naming --device."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise LmdataError(f"--device {name}: this torch build sees no CUDA device; use --device cpu")
        return torch.device(name) if ":" in name else torch.device("cuda", local_rank)
    if name == "mps" and not torch.backends.mps.is_available():
        raise LmdataError("--device mps: MPS is not available here; use --device cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise LmdataError(f"--device {name!r}: not a device; use auto, cpu, cuda, cuda:N or mps") from None


def init_distributed(device_name: str) -> Dist:
    """Join the torchrun process group when WORLD_SIZE > 1 (gloo on CPU, nccl on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    owns = not dist.is_initialized()
    if owns:
        cuda = device_name in ("auto", "cuda") and torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(local)
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return Dist(rank, world, local, owns)


def allreduce_mean(values: list[float], dist: Dist) -> list[float]:
    if dist.world_size == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    torch.distributed.all_reduce(t)
    return (t / dist.world_size).tolist()


def guess_gpu(device: torch.device) -> str:
    """The ACCELERATORS key of this CUDA device by its name ("NVIDIA H100 80GB HBM3" -> h100); "" if unknown."""
    from lmdata.model.flops import ACCELERATORS

    if device.type != "cuda":
        return ""
    name = torch.cuda.get_device_name(device).lower().replace(" ", "")
    if "h100" in name and "pcie" in name:
        return "h100-pcie"
    return next((key for key in ACCELERATORS if key.replace("-", "") in name), "")
