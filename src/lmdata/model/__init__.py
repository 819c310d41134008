"""From-scratch Transformer language model (modules written here, not taken from torch.nn).

Kept light: ``import lmdata.model`` does not import torch until a name is used, e.g.
``from lmdata.model import TransformerLM`` (which loads ``lmdata.model.transformer``).
"""

from __future__ import annotations

from lmdata._lazy import lazy_exports

_EXPORTS = {
    "Linear": "lmdata.model.layers",
    "Embedding": "lmdata.model.layers",
    "RMSNorm": "lmdata.model.layers",
    "SwiGLU": "lmdata.model.layers",
    "RotaryEmbedding": "lmdata.model.layers",
    "softmax": "lmdata.model.functional",
    "scaled_dot_product_attention": "lmdata.model.functional",
    "MultiHeadSelfAttention": "lmdata.model.attention",
    "TransformerBlock": "lmdata.model.transformer",
    "TransformerLM": "lmdata.model.transformer",
    "PRESETS": "lmdata.model.presets",
    "model_config": "lmdata.model.transformer",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
