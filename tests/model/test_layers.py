"""Leaf modules against independent computations (torch ops, hand-worked values)."""

import math

import pytest

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from lmdata.model.functional import scaled_dot_product_attention, softmax
from lmdata.model.layers import Embedding, Linear, RMSNorm, RotaryEmbedding, SwiGLU


def test_linear_matches_functional_and_init_is_truncated():
    torch.manual_seed(0)
    lin = Linear(300, 200)
    assert lin.weight.shape == (200, 300) and list(lin.state_dict()) == ["weight"]
    std = math.sqrt(2 / 500)
    assert lin.weight.abs().max() <= 3 * std + 1e-6
    assert abs(lin.weight.std().item() - std) < 0.15 * std  # truncation shrinks std by ~1.3%
    x = torch.randn(2, 5, 300)
    torch.testing.assert_close(lin(x), F.linear(x, lin.weight))


def test_embedding_is_a_lookup():
    emb = Embedding(10, 4)
    ids = torch.tensor([[1, 2], [9, 1]])
    torch.testing.assert_close(emb(ids), F.embedding(ids, emb.weight))


def test_rmsnorm_formula_and_dtype():
    norm = RMSNorm(4, eps=0.0)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 1.0, 1.0]))
    x = torch.tensor([[3.0, 4.0, 0.0, 0.0]])  # rms = sqrt(25/4) = 2.5
    torch.testing.assert_close(norm(x), torch.tensor([[1.2, 3.2, 0.0, 0.0]]))
    xb = torch.randn(3, 4, dtype=torch.bfloat16)
    assert norm(xb).dtype == torch.bfloat16


def test_swiglu_formula():
    torch.manual_seed(0)
    ffn = SwiGLU(8, 16)
    x = torch.randn(3, 8)
    want = F.linear(F.silu(F.linear(x, ffn.w1.weight)) * F.linear(x, ffn.w3.weight), ffn.w2.weight)
    torch.testing.assert_close(ffn(x), want)


def test_softmax_matches_torch_and_is_stable():
    x = torch.randn(4, 7) * 10
    torch.testing.assert_close(softmax(x, dim=-1), torch.softmax(x, dim=-1))
    torch.testing.assert_close(softmax(x, dim=0), torch.softmax(x, dim=0))
    big = torch.tensor([1e4, 1e4 - 1.0, -1e4])
    assert torch.isfinite(softmax(big)).all()
    torch.testing.assert_close(softmax(big), torch.softmax(big, dim=0))


def test_sdpa_matches_torch_with_mask_and_leading_dims():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 6, 8), torch.randn(2, 3, 5, 7, 8), torch.randn(2, 3, 5, 7, 4)
    mask = torch.rand(6, 7) > 0.3
    mask[:, 0] = True  # every query keeps a key
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v, mask), want)
    torch.testing.assert_close(scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


def test_rope_hand_worked_rotation():
    rope = RotaryEmbedding(theta=100.0, d_k=4, max_seq_len=8)
    x = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    out = rope(x, torch.tensor([3]))
    a0, a1 = 3.0, 3.0 * 100 ** (-2 / 4)  # pair i rotates by pos * theta^(-2i/d_k)
    want = torch.tensor([[math.cos(a0), math.sin(a0), math.cos(a1), math.sin(a1)]])
    torch.testing.assert_close(out, want)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 13), st.integers(0, 2**31 - 1))
def test_rope_preserves_norms_and_depends_on_relative_position(p, q, shift, seed):
    g = torch.Generator().manual_seed(seed)
    rope = RotaryEmbedding(theta=10000.0, d_k=16, max_seq_len=64)
    a, b = torch.randn(16, generator=g), torch.randn(16, generator=g)
    ra = rope(a[None], torch.tensor([p]))[0]
    torch.testing.assert_close(ra.norm(), a.norm())
    dot = rope(a[None], torch.tensor([p]))[0] @ rope(b[None], torch.tensor([q]))[0]
    dot_shifted = rope(a[None], torch.tensor([p + shift]))[0] @ rope(b[None], torch.tensor([q + shift]))[0]
    torch.testing.assert_close(dot, dot_shifted, atol=1e-4, rtol=1e-4)


def test_rope_accepts_batched_position_ids():
    rope = RotaryEmbedding(10000.0, 8, 32)
    x = torch.randn(2, 3, 5, 8)  # [B, H, T, d_k]
    pos = torch.tensor([[0, 1, 2, 0, 1], [4, 5, 6, 7, 8]])
    out = rope(x, pos[:, None, :])
    torch.testing.assert_close(out[0, :, 3], rope(x[0, :, 3:4], torch.tensor([0]))[:, 0])
    torch.testing.assert_close(out[1, :, 0], rope(x[1, :, 0:1], torch.tensor([4]))[:, 0])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-50, 50), min_size=1, max_size=12), st.floats(-1e4, 1e4))
def test_softmax_is_shift_invariant_and_sums_to_one(values, shift):
    x = torch.tensor(values, dtype=torch.float64)
    torch.testing.assert_close(softmax(x + shift), softmax(x), atol=1e-9, rtol=1e-7)
    assert softmax(x).sum().item() == pytest.approx(1.0)
