"""Learning-rate schedule: linear warm-up, cosine decay, then a floor."""

from __future__ import annotations

import math


def cosine_lr(t: int, lr_max: float, lr_min: float, warmup: int, cosine_steps: int) -> float:
    """lr at step ``t``: t/warmup·lr_max while t < warmup; cosine from lr_max to lr_min
    until ``cosine_steps``; lr_min after.

    >>> cosine_lr(0, 1.0, 0.1, 10, 110), cosine_lr(10, 1.0, 0.1, 10, 110), cosine_lr(200, 1.0, 0.1, 10, 110)
    (0.0, 1.0, 0.1)
    """
    if t < warmup:
        return lr_max * t / warmup
    if t <= cosine_steps:
        frac = (t - warmup) / max(1, cosine_steps - warmup)
        return lr_min + 0.5 * (1 + math.cos(math.pi * frac)) * (lr_max - lr_min)
    return lr_min
