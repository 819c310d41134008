"""One optimizer step, as ``lmdata train`` runs it and ``bench/train.py`` times it.

``loss_fn`` is the forward (mean cross entropy, under bf16 autocast if asked); ``train_step`` runs a
step's micro-batches, each loss scaled by 1/N before its backward, then clips and updates.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from lmdata.train.loss import cross_entropy
from lmdata.train.optim import clip_gradients


def loss_fn(model: torch.nn.Module, device: torch.device, precision: str) -> Callable[..., torch.Tensor]:
    """(inputs, targets[, doc positions]) -> mean cross entropy, under bf16 autocast if asked."""
    def forward(inputs: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        ctx = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
        with ctx:
            return cross_entropy(model(inputs, positions), targets)
    return forward


def train_step(forward: Callable[..., torch.Tensor], optimizer: torch.optim.Optimizer,
               micro_batches: list[list[torch.Tensor]], grad_clip: float,
               no_sync: Callable[[], Any] = contextlib.nullcontext) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over ``micro_batches`` (each ``[inputs, targets[, positions]]``, all the
    same shape): forward and backward of each with its loss scaled by 1/N (so the gradient is
    the big batch's), global-norm clip, update. Returns (mean loss, grad norm) tensors.

    ``no_sync``: DDP's ``model.no_sync`` (gradients all-reduce only on the last micro-batch).
    bench/train.py times exactly this function.
    """
    n = len(micro_batches)
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros(())
    for i, batch in enumerate(micro_batches):
        with no_sync() if i < n - 1 else contextlib.nullcontext():
            loss = forward(*batch)
            (loss / n).backward()
        total = total.to(loss.device) + loss.detach().float() / n
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = clip_gradients(params, grad_clip)
    optimizer.step()
    return total, grad_norm
