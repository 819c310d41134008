"""Gradient accumulation: N micro-batches make the step of one batch N times larger; resume stays exact."""

from __future__ import annotations

import json

import pytest
import torch

from lmdata.model.transformer import TransformerLM, model_config
from lmdata.train.checkpoint import read_checkpoint
from lmdata.train.loop import loss_fn, train, train_step
from lmdata.train.optim import AdamW

from test_loop import Crash, cfg, crash_at


def _model_and_opt(seed: int = 0):
    torch.manual_seed(seed)
    model = TransformerLM(**model_config("tiny", vocab_size=97))
    return model, AdamW(model.parameters(), lr=1e-2)


@pytest.mark.parametrize("n", [2, 4])
def test_accumulated_step_equals_one_big_batch(n):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 97, (8, 32), generator=g)
    y = torch.randint(0, 97, (8, 32), generator=g)
    big, big_opt = _model_and_opt()
    acc, acc_opt = _model_and_opt()
    big_loss, big_norm = train_step(loss_fn(big, torch.device("cpu"), "fp32"), big_opt, [[x, y]], grad_clip=0.0)
    micro = [[xm, ym] for xm, ym in zip(x.chunk(n), y.chunk(n))]
    acc_loss, acc_norm = train_step(loss_fn(acc, torch.device("cpu"), "fp32"), acc_opt, micro, grad_clip=0.0)
    assert acc_loss.item() == pytest.approx(big_loss.item(), rel=1e-6, abs=1e-6)
    assert acc_norm.item() == pytest.approx(big_norm.item(), rel=1e-5)
    for (name, p), q in zip(big.named_parameters(), acc.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_training_with_accumulation_counts_tokens_and_resumes_exactly(sample_store, tmp_path):
    kw = dict(steps=20, grad_accum=3, batch_size=4, keep=2)
    full = train(cfg(sample_store, tmp_path / "full", **kw))
    with pytest.raises(Crash):  # dies after step 15; the newest checkpoint is step 10
        train(cfg(sample_store, tmp_path / "cut", **kw), log=crash_at(15))
    resumed = train(cfg(sample_store, tmp_path / "cut", resume=True, **kw))
    assert resumed.start_step == 10
    assert resumed.losses == full.losses[10:]  # bit for bit
    assert resumed.val_loss == full.val_loss
    payload = read_checkpoint(tmp_path / "full" / "checkpoints" / "ckpt-00000020.pt")
    assert (payload["loader"][0]["epoch"], payload["loader"][0]["batch"]) == (0, 60)  # 20 steps x 3 micro-batches
    assert payload["meta"]["grad_accum"] == 3
    rec = json.loads((tmp_path / "full" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"mfu", "model_flops_per_s"} <= set(rec) and rec["mfu"] is None  # CPU: no --gpu, no MFU
    # another accumulation is another run: refused with the flag to use
    with pytest.raises(Exception, match="--grad-accum"):
        train(cfg(sample_store, tmp_path / "full", resume=True, **{**kw, "steps": 30, "grad_accum": 2}))


def test_mfu_is_tokens_times_flops_over_peak(sample_store, tmp_path):
    from lmdata.model.flops import accelerator_flops, model_cost

    train(cfg(sample_store, tmp_path / "run", steps=5, log_every=5, gpu="h100", eval_every=0, ckpt_every=0))
    rec = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    meta = read_checkpoint(tmp_path / "run" / "checkpoints" / "ckpt-00000005.pt")["meta"]
    flops = model_cost(meta["model_config"], meta["seq_len"]).flops_per_token
    assert rec["model_flops_per_s"] == pytest.approx(rec["tokens_per_s"] * flops)
    assert rec["mfu"] == pytest.approx(rec["model_flops_per_s"] / accelerator_flops("h100"))


def test_size_flags_override_the_preset(sample_store, tmp_path):
    train(cfg(sample_store, tmp_path / "run", steps=2, d_model=32, layers=1, heads=2, d_ff=64, context=32,
              eval_every=0, ckpt_every=0, log_every=1))
    meta = read_checkpoint(tmp_path / "run" / "checkpoints" / "ckpt-00000002.pt")["meta"]
    mc = meta["model_config"]
    assert (mc["d_model"], mc["num_layers"], mc["num_heads"], mc["d_ff"], mc["context_length"]) == (32, 1, 2, 64, 32)
    assert meta["seq_len"] == 32


def test_heads_that_do_not_divide_d_model_are_one_line(sample_store, tmp_path):
    from lmdata.errors import LmdataError

    with pytest.raises(LmdataError, match="--heads"):
        train(cfg(sample_store, tmp_path / "run", d_model=48, heads=5))
