"""Training throughput: our from-scratch TransformerLM + AdamW vs the same architecture
built from torch's own layers (nn.Linear, nn.Embedding, nn.RMSNorm, F.scaled_dot_product_attention,
torch.optim.AdamW), on the same device, batch and data. Target: ours >= 0.9x torch's tokens/s.

    .venv/bin/python bench/train.py --model tiny --batch-size 16 --steps 30
    .venv/bin/python bench/train.py --model small --batch-size 8 --steps 10 --device cuda --precision bf16
    .venv/bin/python bench/train.py ... --store runs/sample-store   # batches from the store's loader

Variants: ``ours`` (reference attention: our softmax + boolean mask), ``ours-fast`` (the
--fast path: torch's fused SDPA kernel) and ``torch``. Each variant's steps run in rounds,
interleaved with the others (A B C A B C ...), so a noisy shared machine slows all alike;
tokens/s is the median over rounds. Our step is ``lmdata.train.loop.train_step``, the
function ``lmdata train`` runs; batches come from ``make_loader`` when --store is given,
else one fixed random batch (model compute only).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from lmdata.model.transformer import TransformerLM, model_config
from lmdata.model.flops import accelerator_flops, model_cost
from lmdata.train.device import guess_gpu, resolve_device
from lmdata.train.loop import loss_fn, train_step
from lmdata.train.optim import AdamW


class TorchBlock(nn.Module):
    def __init__(self, d_model: int, num_heads: int, d_ff: int, context_length: int, theta: float) -> None:
        super().__init__()
        self.h, self.dk = num_heads, d_model // num_heads
        self.ln1, self.ln2 = nn.RMSNorm(d_model, eps=1e-5), nn.RMSNorm(d_model, eps=1e-5)
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))
        self.w1, self.w3 = nn.Linear(d_model, d_ff, bias=False), nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        inv = theta ** (-torch.arange(0, self.dk, 2).float() / self.dk)
        ang = torch.arange(context_length).float()[:, None] * inv
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def rope(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, H, T, dk], adjacent pairs
        T = x.shape[-2]
        cos, sin = self.cos[:T], self.sin[:T]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        y = self.ln1(x)
        q, k, v = (p(y).view(B, T, self.h, self.dk).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, D))
        y = self.ln2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class TorchLM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(TorchBlock(d_model, num_heads, d_ff, context_length, rope_theta)
                                    for _ in range(num_layers))
        self.ln, self.head = nn.RMSNorm(d_model, eps=1e-5), nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, ids: torch.Tensor, positions: None = None) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


def torch_step(model: nn.Module, opt: torch.optim.Optimizer, batch, precision: str, device) -> torch.Tensor:
    ctx = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    with ctx:
        logits = model(batch[0])
    loss = F.cross_entropy(logits.float().flatten(0, 1), batch[1].flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def make_variants(cfg: dict, device, precision: str, lr: float = 1e-3):
    """name -> step() closures over each model and optimizer."""
    variants = {}
    for name, fast in (("ours", False), ("ours-fast", True)):
        torch.manual_seed(0)
        model = TransformerLM(**cfg, fast=fast).to(device)
        opt = AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
        fwd = loss_fn(model, device, precision)
        variants[name] = lambda batch, fwd=fwd, opt=opt: train_step(fwd, opt, [batch], 1.0)[0]
    torch.manual_seed(0)
    tmodel = TorchLM(**cfg).to(device)
    topt = torch.optim.AdamW(tmodel.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    variants["torch"] = lambda batch: torch_step(tmodel, topt, batch, precision, device)
    return variants


def batches(args, cfg: dict, device):
    if args.store:
        from lmdata.data.loader import make_loader
        from lmdata.store import open_store

        ds = open_store(args.store).dataset("train", args.seq_len)
        loader = make_loader(ds, args.batch_size, num_workers=args.workers, seed=0)
        while True:
            for x, y in loader:
                yield [x.to(device), y.to(device)]
    g = torch.Generator().manual_seed(0)
    fixed = torch.randint(0, cfg["vocab_size"], (args.batch_size, args.seq_len + 1), generator=g).to(device)
    while True:
        yield [fixed[:, :-1], fixed[:, 1:]]


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--vocab-size", type=int, default=0, help="override the preset's vocab (default: preset or store)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=0, help="default: the preset's context_length")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per variant, in --rounds rounds")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                    help="auto = bf16 autocast on CUDA, fp32 elsewhere (as lmdata train)")
    ap.add_argument("--gpu", default="", help="MFU against this accelerator's peak (lmdata.model.flops.ACCELERATORS); "
                    "default: guessed from the CUDA device; none on CPU")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("--store", default="", help="read batches from this store's train split")
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.precision == "auto":
        args.precision = "bf16" if device.type == "cuda" else "fp32"
    over = {"vocab_size": args.vocab_size} if args.vocab_size else {}
    if args.store:
        from lmdata.store import open_store

        over = {"vocab_size": open_store(args.store).manifest.vocab_size}
    cfg = model_config(args.model, **over)
    args.seq_len = args.seq_len or cfg["context_length"]
    variants = make_variants(cfg, device, args.precision)
    data = batches(args, cfg, device)
    for step in variants.values():  # warm-up: allocator, kernels, lazy init
        for _ in range(args.warmup_steps):
            step(next(data))
    sync(device)
    per_round = max(1, args.steps // args.rounds)
    rates: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, step in variants.items():
            t0 = time.perf_counter()
            for _ in range(per_round):
                loss = step(next(data))
            loss.item()
            sync(device)
            rates[name].append(per_round * args.batch_size * args.seq_len / (time.perf_counter() - t0))
    ref = statistics.median(rates["torch"])
    print(f"# {args.model} {cfg} batch {args.batch_size}x{args.seq_len} on {device} {args.precision}, "
          f"threads {torch.get_num_threads()}, {args.rounds} rounds x {per_round} steps, data: {args.store or 'fixed batch'}")
    # MFU: the FLOPs/token of `lmdata plan` (the same count train's log line uses) over the peak
    flops = model_cost(cfg, args.seq_len).flops_per_token
    gpu = args.gpu or guess_gpu(device)
    peak = accelerator_flops(gpu) if gpu else None
    print(f"# FLOPs/token {flops:.4g}; MFU against {gpu + ' (' + format(peak / 1e12, '.0f') + ' TFLOP/s bf16)' if gpu else 'no accelerator (CPU: model GFLOP/s shown)'}")
    print("| variant | tokens/s (median) | min..max | vs torch | " + ("MFU |" if peak else "GFLOP/s |"))
    print("|---|---:|---:|---:|---:|")
    for name, r in rates.items():
        med = statistics.median(r)
        eff = f"{med * flops / peak:.1%}" if peak else f"{med * flops / 1e9:,.1f}"
        print(f"| {name} | {med:,.0f} | {min(r):,.0f}..{max(r):,.0f} | {med / ref:.2f}x | {eff} |")


if __name__ == "__main__":
    main()
