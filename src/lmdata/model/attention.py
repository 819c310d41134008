"""Causal multi-head self-attention with optional RoPE and document masking.

Reference path: our ``scaled_dot_product_attention`` with an explicit boolean mask.
Fast path (``fast=True``): torch's fused ``F.scaled_dot_product_attention`` (flash/
memory-efficient kernels on CUDA, a fused kernel on CPU); same math, tested to match.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmdata.model.functional import scaled_dot_product_attention
from lmdata.model.layers import Linear, RotaryEmbedding


def causal_mask(seq_len: int, device: torch.device | None = None) -> Tensor:
    """[T, T] bool, True on and below the diagonal (query i sees keys j <= i)."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()


class MultiHeadSelfAttention(nn.Module):
    """q_proj/k_proj/v_proj/output_proj, each [d_model, d_model]; heads of d_k = d_model / num_heads."""

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        max_seq_len: int | None = None,
        theta: float | None = None,
        fast: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads, self.d_k = num_heads, d_model // num_heads
        self.fast = fast
        self.q_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.k_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.v_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.output_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.rope = None
        if theta is not None:
            if max_seq_len is None:
                raise ValueError("MultiHeadSelfAttention: RoPE (theta=...) needs max_seq_len")
            self.rope = RotaryEmbedding(theta, self.d_k, max_seq_len, device=device)

    def forward(self, x: Tensor, token_positions: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """x: [..., T, d_model]; token_positions: [..., T] (default 0..T-1);
        mask: bool broadcastable to [..., heads, T, T], default causal."""
        *lead, T, d_model = x.shape
        q, k, v = (self._split_heads(p(x)) for p in (self.q_proj, self.k_proj, self.v_proj))  # [..., H, T, d_k]
        if self.rope is not None:
            if token_positions is None:
                token_positions = torch.arange(T, device=x.device)
            pos = token_positions.unsqueeze(-2)  # [..., 1, T]: broadcast over heads
            q, k = self.rope(q, pos), self.rope(k, pos)
        if self.fast:
            if mask is None:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            out = scaled_dot_product_attention(q, k, v, causal_mask(T, x.device) if mask is None else mask)
        out = out.transpose(-3, -2).reshape(*lead, T, d_model)  # [..., T, H*d_k]
        return self.output_proj(out)

    def _split_heads(self, t: Tensor) -> Tensor:
        *lead, T, _ = t.shape
        return t.view(*lead, T, self.num_heads, self.d_k).transpose(-3, -2)
