"""Stateless building blocks: a stable softmax and scaled dot-product attention.

These are the reference path. ``MultiHeadSelfAttention(fast=True)`` swaps in torch's fused
``F.scaled_dot_product_attention``; tests/model checks both agree.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax along ``dim`` after subtracting the max (no overflow); bf16/fp16 are computed in float32.

    >>> softmax(torch.tensor([1000.0, 1000.0]))  # tensor([0.5000, 0.5000])
    """
    in_dtype = x.dtype
    if in_dtype not in (torch.float32, torch.float64):
        x = x.float()
    shifted = x - x.amax(dim=dim, keepdim=True)
    exp = torch.exp(shifted)
    return (exp / exp.sum(dim=dim, keepdim=True)).to(in_dtype)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """softmax(q kᵀ / sqrt(d_k)) v over any leading batch dims.

    q: [..., T_q, d_k], k: [..., T_k, d_k], v: [..., T_k, d_v];
    mask: bool, broadcastable to [..., T_q, T_k], True where a query may attend a key.
    Every query row must keep at least one key (a causal mask always keeps the diagonal).
    """
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # [..., T_q, T_k]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = softmax(scores, dim=-1).to(v.dtype)
    return weights @ v  # [..., T_q, d_v]
