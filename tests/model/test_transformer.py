"""Attention and the full model: reference vs torch, fast path vs reference, --doc-mask."""

import pytest
import torch
import torch.nn.functional as F

from lmdata.errors import LmdataError
from lmdata.model.attention import MultiHeadSelfAttention
from lmdata.model.layers import RotaryEmbedding
from lmdata.model.transformer import PRESETS, TransformerLM, document_mask, model_config

CFG = dict(vocab_size=50, context_length=16, d_model=32, num_layers=2, num_heads=4, d_ff=64, rope_theta=10000.0)


def test_attention_matches_torch_composition():
    torch.manual_seed(0)
    attn = MultiHeadSelfAttention(d_model=32, num_heads=4, max_seq_len=16, theta=10000.0)
    x = torch.randn(2, 10, 32)
    B, T, H, dk = 2, 10, 4, 8

    def heads(w):
        return F.linear(x, w).view(B, T, H, dk).transpose(1, 2)

    rope = RotaryEmbedding(10000.0, dk, 16)
    pos = torch.arange(T)
    q, k, v = rope(heads(attn.q_proj.weight), pos), rope(heads(attn.k_proj.weight), pos), heads(attn.v_proj.weight)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, 32)
    torch.testing.assert_close(attn(x), F.linear(o, attn.output_proj.weight))


def test_state_dict_keys_follow_the_contract():
    keys = set(TransformerLM(**CFG).state_dict())
    assert {"token_embeddings.weight", "ln_final.weight", "lm_head.weight"} <= keys
    for n in range(2):
        for part in ["ln1.weight", "attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
                     "attn.output_proj.weight", "ln2.weight", "ffn.w1.weight", "ffn.w2.weight", "ffn.w3.weight"]:
            assert f"layers.{n}.{part}" in keys
    assert len(keys) == 3 + 2 * 9  # RoPE tables are not saved


def test_small_preset_size():
    model = TransformerLM(**model_config("small"), device="meta")  # shapes only, no init cost
    assert 17.0e6 < model.num_params(non_embedding=True) < 18.0e6


def test_fast_path_matches_reference_forward_and_backward():
    torch.manual_seed(0)
    ref = TransformerLM(**CFG)
    fast = TransformerLM(**CFG, fast=True)
    fast.load_state_dict(ref.state_dict())
    ids = torch.randint(0, 50, (3, 16))
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]] * 3)
    for doc_positions in (None, pos):
        out_r, out_f = ref(ids, doc_positions), fast(ids, doc_positions)
        torch.testing.assert_close(out_f, out_r, atol=1e-5, rtol=1e-4)
        out_r.square().mean().backward()
        out_f.square().mean().backward()
        for (name, pr), pf in zip(ref.named_parameters(), fast.parameters()):
            torch.testing.assert_close(pf.grad, pr.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_bf16_autocast_stays_close_to_fp32():
    torch.manual_seed(0)
    model = TransformerLM(**CFG)
    ids = torch.randint(0, 50, (2, 16))
    want = model(ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = model(ids)
    assert (got.float() - want).abs().max() < 0.05 * want.abs().max() + 0.05


@pytest.mark.parametrize("fast", [False, True])
def test_doc_mask_equals_running_each_document_alone(fast):
    torch.manual_seed(0)
    model = TransformerLM(**CFG, fast=fast)
    docs = [torch.randint(0, 50, (n,)) for n in (5, 7, 4)]
    ids = torch.cat(docs)[None]  # [1, 16]
    pos = torch.cat([torch.arange(len(d)) for d in docs])[None]
    packed = model(ids, pos)[0]
    alone = torch.cat([model(d[None])[0] for d in docs])
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-4)


def test_doc_mask_when_window_starts_mid_document():
    pos = torch.tensor([[7, 8, 0, 1]])
    mask = document_mask(pos)[0, 0]
    assert mask.tolist() == [[True, False, False, False], [True, True, False, False],
                             [False, False, True, False], [False, False, True, True]]


def test_bad_preset_and_too_long_input():
    with pytest.raises(LmdataError, match="tiny"):
        model_config("huge")
    assert set(PRESETS) >= {"tiny", "small"}
    with pytest.raises(LmdataError, match="context_length 16"):
        TransformerLM(**CFG)(torch.zeros(1, 17, dtype=torch.long))
