"""plan's arithmetic against the real model: parameter count and matmul FLOPs, exactly."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from lmdata.model import flops
from lmdata.errors import LmdataError
from lmdata.model import PRESETS, TransformerLM
from lmdata.train.loss import cross_entropy


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_plan_param_count_equals_the_models_own(name):
    kw = PRESETS[name]
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = TransformerLM(**kw)
    p = flops.plan(name, "h100", batch_size=4, seq_len=kw["context_length"], vocab_size=kw["vocab_size"])
    assert p.params == sum(t.numel() for t in model.parameters())
    assert p.params - p.params_matmul == model.token_embeddings.weight.numel() + sum(
        t.numel() for n, t in model.named_parameters() if n.endswith(("ln1.weight", "ln2.weight", "ln_final.weight"))
    )


def test_flops_per_token_match_torch_flop_counter_on_forward_and_backward():
    kw = flops.model_kwargs("tiny", vocab_size=96, context_length=16)
    model = TransformerLM(**kw)
    b, t = 2, 16
    x = torch.randint(0, 96, (b, t))
    with FlopCounterMode(display=False) as counter:
        logits = model(x)
        cross_entropy(logits.reshape(-1, 96), x.reshape(-1)).backward()
    cost = flops.model_cost(kw, seq_len=t)
    assert counter.get_total_flops() == cost.flops_per_token * b * t


def test_plan_rates_follow_from_flops_and_mfu():
    p = flops.plan("small", "a100", batch_size=8, seq_len=128, vocab_size=1000, mfu=0.5)
    assert p.tokens_per_s_needed == pytest.approx(0.5 * 312e12 / p.flops_per_token)
    assert p.step_ms == pytest.approx(1000 * 8 * 128 / p.tokens_per_s_needed)
    assert p.memory_total_bytes == 16 * p.params + p.memory_activations_bytes


def test_unknown_names_are_clear_errors():
    with pytest.raises(LmdataError, match="--gpu 'tpu9'"):
        flops.plan("small", "tpu9", 8, 128, 1000)
    with pytest.raises(LmdataError, match="--model 'huge'"):
        flops.plan("huge", "h100", 8, 128, 1000)
    with pytest.raises(LmdataError, match="--mfu"):
        flops.plan("small", "h100", 8, 128, 1000, mfu=1.5)
