"""Optimizer, clipping, schedule, loss and get_batch against independent computations."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmdata.train.batch import get_batch
from lmdata.train.loss import cross_entropy
from lmdata.train.optim import AdamW, clip_gradients
from lmdata.train.schedule import cosine_lr


def _train(opt_cls, steps=10, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = opt_cls(model.parameters(), **kw)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def test_adamw_matches_torch_over_several_steps():
    kw = dict(lr=3e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ours, theirs = _train(AdamW, **kw), _train(torch.optim.AdamW, **kw)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_adamw_state_dict_round_trip_continues_identically():
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(5))
    b = torch.nn.Parameter(a.detach().clone())
    opt_a, opt_b = AdamW([a], lr=0.1), AdamW([b], lr=0.1)
    for step in range(6):
        if step == 3:  # swap b's optimizer for a fresh one restored from a state dict
            opt_b2 = AdamW([b], lr=0.1)
            opt_b2.load_state_dict(opt_b.state_dict())
            opt_b = opt_b2
        for p, opt in ((a, opt_a), (b, opt_b)):
            opt.zero_grad()
            (p.sin().sum()).backward()
            opt.step()
    assert torch.equal(a, b)


def test_clip_gradients_global_norm():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
    norm = clip_gradients([a, b], max_norm=1.0)
    assert norm.item() == pytest.approx(5.0)
    torch.testing.assert_close(a.grad, torch.tensor([0.6, 0.0]), atol=1e-5, rtol=0)
    torch.testing.assert_close(b.grad, torch.tensor([0.8]), atol=1e-5, rtol=0)
    a.grad, b.grad = torch.tensor([0.3, 0.0]), torch.tensor([0.4])
    clip_gradients([a, b], max_norm=1.0)  # below the limit: untouched
    torch.testing.assert_close(b.grad, torch.tensor([0.4]))


def test_cosine_lr_shape():
    lr = [cosine_lr(t, 1.0, 0.1, 10, 110) for t in range(130)]
    assert lr[0] == 0 and lr[5] == pytest.approx(0.5) and lr[10] == pytest.approx(1.0)
    assert lr[60] == pytest.approx(0.1 + 0.5 * 0.9)  # half-way down the cosine
    assert lr[110] == pytest.approx(0.1) and lr[129] == 0.1
    assert all(a >= b for a, b in zip(lr[10:], lr[11:]))


def test_cross_entropy_matches_torch_over_leading_dims_and_is_stable():
    logits, targets = torch.randn(2, 3, 11) * 5, torch.randint(0, 11, (2, 3))
    want = F.cross_entropy(logits.reshape(-1, 11), targets.reshape(-1))
    torch.testing.assert_close(cross_entropy(logits, targets), want)
    big = torch.tensor([[1e4, 0.0, -1e4]])
    assert cross_entropy(big, torch.tensor([1])).item() == pytest.approx(1e4)
    assert math.isfinite(cross_entropy(big.to(torch.bfloat16), torch.tensor([0])).item())


def test_cross_entropy_gradient_matches_torch():
    logits = (torch.randn(3, 4, 9, dtype=torch.float64) * 4).requires_grad_()
    targets = torch.randint(0, 9, (3, 4))
    torch.autograd.gradcheck(cross_entropy, (logits, targets))
    (g_ours,) = torch.autograd.grad(cross_entropy(logits, targets) * 3, logits)
    (g_torch,) = torch.autograd.grad(F.cross_entropy(logits.reshape(-1, 9), targets.reshape(-1)) * 3, logits)
    torch.testing.assert_close(g_ours, g_torch)
    half = logits.detach().to(torch.bfloat16).requires_grad_()
    cross_entropy(half, targets).backward()
    assert half.grad.dtype == torch.bfloat16


def test_get_batch_windows_are_shifted_slices():
    tokens = np.arange(100, dtype=np.uint16)
    x, y = get_batch(tokens, 8, 5, "cpu", rng=np.random.default_rng(0))
    assert x.shape == y.shape == (8, 5) and x.dtype == torch.int64
    assert torch.equal(y, x + 1) and torch.equal(x[:, 1:], x[:, :-1] + 1)
    assert int(x.max()) <= 98
