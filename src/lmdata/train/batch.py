"""nanoGPT-style random batches from one flat token array (no store, no loader).

For quick experiments and the model tests; ``lmdata train`` reads through the loader.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def get_batch(
    tokens: np.ndarray, batch_size: int, context_length: int, device: str | torch.device,
    rng: np.random.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Random windows of a 1-D token array: inputs [B, L] and targets shifted by one, int64 on ``device``."""
    n_starts = len(tokens) - context_length
    if n_starts < 1:
        raise ValueError(f"need more than context_length={context_length} tokens, got {len(tokens)}")
    rng = rng if rng is not None else np.random.default_rng()
    starts = rng.integers(0, n_starts, size=batch_size)
    idx = starts[:, None] + np.arange(context_length + 1)  # [B, L+1]
    windows = torch.from_numpy(np.asarray(tokens)[idx].astype(np.int64))
    return windows[:, :-1].to(device), windows[:, 1:].to(device)
