"""The model's leaf modules: Linear, Embedding, RMSNorm, SwiGLU, RotaryEmbedding.

Written from tensor ops (``torch.nn.Module``, ``Parameter`` and init functions only), so
their state-dict keys are ours: ``weight`` for each, ``w1``/``w2``/``w3`` for SwiGLU.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class Linear(nn.Module):
    """y = x Wᵀ with W of shape [out, in], no bias; truncated-normal init, std sqrt(2/(in+out))."""

    def __init__(self, in_features: int, out_features: int, device=None, dtype=None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        std = math.sqrt(2.0 / (in_features + out_features))
        nn.init.trunc_normal_(self.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.T  # [..., in] -> [..., out]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class Embedding(nn.Module):
    """A lookup table [num_embeddings, embedding_dim]; truncated-normal init (std 1, ±3)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.weight, mean=0.0, std=1.0, a=-3.0, b=3.0)

    def forward(self, token_ids: Tensor) -> Tensor:
        # index_select, not weight[token_ids]: the latter's backward (index_put_ with
        # accumulate) adds rows in thread order on CPU, so two identical runs drift apart
        # by ~1e-7 within 5 steps; index_select's backward is deterministic.
        return self.weight.index_select(0, token_ids.reshape(-1)).view(*token_ids.shape, -1)  # [...] -> [..., d]


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · g, computed in float32 and cast back (safe under bf16)."""

    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        in_dtype = x.dtype
        x32 = x.to(torch.promote_types(in_dtype, torch.float32))  # bf16 -> fp32; fp32/fp64 unchanged
        inv_rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * inv_rms * self.weight).to(in_dtype)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) ⊙ w3 x): the gated feed-forward of LLaMA."""

    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None) -> None:
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device=device, dtype=dtype)
        self.w2 = Linear(d_ff, d_model, device=device, dtype=dtype)
        self.w3 = Linear(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        a = self.w1(x)
        return self.w2(a * torch.sigmoid(a) * self.w3(x))


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each adjacent pair (x[2i], x[2i+1]) by pos · theta^(-2i/d_k).

    cos/sin tables for positions [0, max_seq_len) are precomputed buffers (not saved in
    the state dict); ``token_positions`` may be any ids in range, e.g. restarting at 0 at
    every document start.
    """

    def __init__(self, theta: float, d_k: int, max_seq_len: int, device=None) -> None:
        super().__init__()
        if d_k % 2:
            raise ValueError(f"RoPE needs an even head dimension, got d_k={d_k}")
        self.max_seq_len = max_seq_len
        inv_freq = theta ** (-torch.arange(0, d_k, 2, dtype=torch.float64, device=device) / d_k)  # [d_k/2]
        angles = torch.arange(max_seq_len, dtype=torch.float64, device=device)[:, None] * inv_freq  # [L, d_k/2]
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: Tensor, token_positions: Tensor) -> Tensor:
        """x: [..., T, d_k]; token_positions: int [..., T], broadcastable to x's leading dims."""
        cos = self.cos[token_positions]  # [..., T, d_k/2]
        sin = self.sin[token_positions]
        wide = torch.promote_types(x.dtype, torch.float32)
        x1, x2 = x[..., 0::2].to(wide), x[..., 1::2].to(wide)
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # [..., T, d_k/2, 2]
        return out.flatten(-2).to(x.dtype)
