"""From-scratch Transformer language model (modules written here, not taken from torch.nn).

Kept light: ``import lmdata.model`` does not import torch until a name is used, e.g.
``from lmdata.model import TransformerLM`` (which loads ``lmdata.model.transformer``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Linear": "layers",
    "Embedding": "layers",
    "RMSNorm": "layers",
    "SwiGLU": "layers",
    "RotaryEmbedding": "layers",
    "softmax": "functional",
    "scaled_dot_product_attention": "functional",
    "MultiHeadSelfAttention": "attention",
    "TransformerBlock": "transformer",
    "TransformerLM": "transformer",
    "PRESETS": "transformer",
    "model_config": "transformer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lmdata.model' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lmdata.model.{_EXPORTS[name]}"), name)
