"""Pre-norm Transformer language model (its size presets: ``lmdata.model.presets``).

State-dict keys (public, see DESIGN.md): ``token_embeddings.weight``,
``layers.N.{ln1,attn,ln2,ffn}...``, ``ln_final.weight``, ``lm_head.weight``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lmdata.errors import LmdataError
from lmdata.model.attention import MultiHeadSelfAttention, causal_mask
from lmdata.model.layers import Embedding, Linear, RMSNorm, SwiGLU
from lmdata.model.presets import PRESETS, get_preset  # noqa: F401 (PRESETS: re-exported)


def model_config(preset: str, **overrides: Any) -> dict[str, Any]:
    """The constructor kwargs of ``preset`` with ``overrides`` applied; unknown preset -> LmdataError."""
    return {**get_preset(preset), **overrides}


def document_mask(positions: Tensor) -> Tensor:
    """[B, T] in-document positions -> [B, 1, T, T] bool: causal and within one document.

    A document starts wherever the position does not continue the previous one (0 after
    an end-of-text, or the window's first token).
    """
    B, T = positions.shape
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[:, 1:] = positions[:, 1:] != positions[:, :-1] + 1
    seg = starts.cumsum(dim=1)  # [B, T] document index within the window
    same_doc = seg[:, :, None] == seg[:, None, :]  # [B, T, T]
    return (same_doc & causal_mask(T, positions.device)).unsqueeze(1)


class TransformerBlock(nn.Module):
    """x + attn(ln1(x)), then + ffn(ln2(x))."""

    def __init__(
        self, d_model: int, num_heads: int, d_ff: int, max_seq_len: int, theta: float | None,
        eps: float = 1e-5, fast: bool = False, device=None, dtype=None,
    ) -> None:
        super().__init__()
        self.ln1 = RMSNorm(d_model, eps, device=device, dtype=dtype)
        self.attn = MultiHeadSelfAttention(d_model, num_heads, max_seq_len, theta, fast, device=device, dtype=dtype)
        self.ln2 = RMSNorm(d_model, eps, device=device, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: Tensor, token_positions: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        x = x + self.attn(self.ln1(x), token_positions, mask)
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    """Token ids [B, T] -> next-token logits [B, T, vocab_size]."""

    def __init__(
        self, vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int,
        d_ff: int, rope_theta: float | None = 10000.0, eps: float = 1e-5, fast: bool = False,
        device=None, dtype=None,
    ) -> None:
        super().__init__()
        self.context_length = context_length
        self.token_embeddings = Embedding(vocab_size, d_model, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, context_length, rope_theta, eps, fast, device=device, dtype=dtype)
            for _ in range(num_layers)
        )
        self.ln_final = RMSNorm(d_model, eps, device=device, dtype=dtype)
        self.lm_head = Linear(d_model, vocab_size, device=device, dtype=dtype)

    def set_fast(self, fast: bool) -> None:
        """Switch every attention between the reference and the fused-kernel path."""
        for layer in self.layers:
            layer.attn.fast = fast

    def forward(self, token_ids: Tensor, doc_positions: Tensor | None = None) -> Tensor:
        """token_ids: [B, T]. doc_positions: [B, T] position of each token within its
        document; when given, attention stays inside documents and RoPE uses these
        positions (--doc-mask). Otherwise positions are 0..T-1 and the mask is causal."""
        T = token_ids.shape[-1]
        if T > self.context_length:
            raise LmdataError(f"sequence length {T} exceeds the model's context_length {self.context_length}")
        if doc_positions is None:
            positions, mask = torch.arange(T, device=token_ids.device), None
        else:
            positions, mask = doc_positions, document_mask(doc_positions)
        x = self.token_embeddings(token_ids)  # [B, T, d]
        for layer in self.layers:
            x = layer(x, positions, mask)
        return self.lm_head(self.ln_final(x))  # [B, T, V]

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; non_embedding leaves out the token embedding table (a lookup,
        no FLOPs); the untied lm_head counts."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.token_embeddings.weight.numel() if non_embedding else n
