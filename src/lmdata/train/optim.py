"""AdamW with decoupled weight decay, and global-norm gradient clipping.

Loshchilov & Hutter (2019), as torch.optim.AdamW computes it (tests compare the two
over several steps): decay first (θ ← θ - lr·λ·θ), then the bias-corrected Adam step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor


class AdamW(torch.optim.Optimizer):
    """Adam with weight decay applied to the weights directly, not added to the gradient."""

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid AdamW hyperparameters lr={lr} betas={betas} eps={eps} wd={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.lerp_(p.grad, 1 - beta1)  # m = β1 m + (1-β1) g
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)  # v = β2 v + (1-β2) g²
                p.mul_(1 - lr * wd)
                step_size = lr / (1 - beta1**t)
                denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                p.addcdiv_(m, denom, value=-step_size)
        return loss


def clip_gradients(params: Iterable[Tensor], max_norm: float, eps: float = 1e-6) -> Tensor:
    """Scale all gradients so their global L2 norm is at most ``max_norm``; returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    if max_norm > 0:
        scale = torch.clamp(max_norm / (total + eps), max=1.0)
        for g in grads:
            g.mul_(scale.to(g.dtype))
    return total
