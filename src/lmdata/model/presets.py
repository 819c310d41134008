"""The model presets: name -> constructor keyword arguments (no torch here, so ``--help`` can list them)."""

from __future__ import annotations

from typing import Any

# Presets are plain constructor kwargs. vocab_size is replaced by the store's vocabulary
# when training. "small" is the TinyStories model: 17.6M non-embedding parameters
# (4 x (4·512² + 3·512·1344) = 12.5M in the blocks, 5.1M in the untied lm_head),
# plus 5.1M in the token embedding table. "gpt2-small" is GPT-2 small's shape (12 x 768,
# 12 heads, context 1024, GPT-2's vocabulary) with SwiGLU at d_ff 2048, which keeps the
# FFN's 3·768·2048 = 4.7M parameters per block equal to GPT-2's 2·768·3072: 85.0M in the
# blocks + 38.6M in the untied lm_head = 123.6M non-embedding parameters (GPT-2's
# "124M" counts its tied embedding once), 162.2M with the embedding table.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=512, context_length=64, d_model=64, num_layers=2, num_heads=4, d_ff=176, rope_theta=10000.0),
    "small": dict(vocab_size=10000, context_length=256, d_model=512, num_layers=4, num_heads=16, d_ff=1344, rope_theta=10000.0),
    "gpt2-small": dict(vocab_size=50257, context_length=1024, d_model=768, num_layers=12, num_heads=12, d_ff=2048,
                       rope_theta=10000.0),
}


def get_preset(name: str) -> dict[str, Any]:
    """A copy of preset ``name``'s kwargs; an unknown name is one line naming ``--model`` and the presets
    (train and plan/bench had worded it two ways)."""
    if name not in PRESETS:
        from lmdata.errors import LmdataError

        raise LmdataError(f"--model {name!r}: unknown preset; choose one of {', '.join(PRESETS)}")
    return dict(PRESETS[name])
