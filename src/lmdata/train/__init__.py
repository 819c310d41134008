"""Training: optimizer, schedule, loss, batches, checkpoints, the loop and its CLI.

Kept light (no torch at import): names load on first use, e.g.
``from lmdata.train import AdamW, cosine_lr`` or ``from lmdata.train import train``.
"""

from __future__ import annotations

from lmdata._lazy import lazy_exports

_EXPORTS = {
    "AdamW": "lmdata.train.optim",
    "clip_gradients": "lmdata.train.optim",
    "cosine_lr": "lmdata.train.schedule",
    "cross_entropy": "lmdata.train.loss",
    "get_batch": "lmdata.train.batch",
    "save_checkpoint": "lmdata.train.checkpoint",
    "load_checkpoint": "lmdata.train.checkpoint",
    "TrainConfig": "lmdata.config",
    "train": "lmdata.train.loop",
    "train_step": "lmdata.train.loop",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
