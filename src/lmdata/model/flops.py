"""What a model preset costs: parameters, FLOPs per token, memory, and the token rate it eats.

The question behind ``lmdata plan`` and the keep-up column of ``lmdata bench``: how many
tokens per second must the loader deliver so a given accelerator never waits? That rate is
``MFU * peak FLOP/s / FLOPs per token``. FLOPs are counted matmul by matmul (a matmul of
``[m, k] @ [k, n]`` is ``2*m*k*n``; backward is twice forward), which gives, per token,

    6 * N_matmul  +  12 * num_layers * seq_len * d_model

where ``N_matmul`` is every parameter that multiplies an activation (attention and SwiGLU
projections, ``lm_head``), i.e. all parameters minus the embedding table (a lookup) and the
RMSNorm gains. The second term is ``Q @ K^T`` and ``A @ V`` over the full ``seq_len`` (our
attention computes the whole score matrix and masks it, so no causal halving); it is the
count PaLM's appendix and nanoGPT's ``estimate_mfu`` use. A test checks this formula against
``torch.utils.flop_counter`` on a real forward+backward, exactly.

Pure arithmetic over plain dicts (the presets themselves live beside the model).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from lmdata.errors import LmdataError
from lmdata.model.presets import get_preset

# Peak dense (no sparsity) bf16 tensor FLOP/s from the vendors' data sheets.
ACCELERATORS: dict[str, tuple[float, str]] = {
    "b200": (2250e12, "NVIDIA B200"),
    "mi300x": (1307e12, "AMD Instinct MI300X"),
    "h200": (989e12, "NVIDIA H200 SXM"),
    "h100": (989e12, "NVIDIA H100 SXM"),
    "h100-pcie": (756e12, "NVIDIA H100 PCIe"),
    "l40s": (362e12, "NVIDIA L40S"),
    "a100": (312e12, "NVIDIA A100 (SXM or PCIe)"),
    "rtx4090": (165e12, "NVIDIA GeForce RTX 4090 (fp32 accumulate)"),
    "a10": (125e12, "NVIDIA A10"),
    "l4": (121e12, "NVIDIA L4"),
}

DEFAULT_MFU = 0.4
BYTES_PER_PARAM_TRAINING = 16  # fp32 weights 4 + fp32 grads 4 + AdamW m and v 8


def accelerator_flops(name: str) -> float:
    """Peak dense bf16 FLOP/s of a named accelerator; the error lists the names we know."""
    key = name.lower()
    if key not in ACCELERATORS:
        raise LmdataError(f"--gpu {name!r}: unknown accelerator; choose one of {', '.join(ACCELERATORS)}")
    return ACCELERATORS[key][0]


def model_kwargs(name: str, vocab_size: int, context_length: int) -> dict[str, Any]:
    """The ``TransformerLM`` keyword arguments of a preset for a given vocabulary and length."""
    return {**get_preset(name), "vocab_size": int(vocab_size), "context_length": int(context_length)}


@dataclass
class ModelCost:
    """Counts for one model shape at one sequence length (per token unless named otherwise)."""

    params: int
    params_matmul: int
    flops_per_token: float
    attention_flops_per_token: float


def model_cost(kw: dict[str, Any], seq_len: int | None = None) -> ModelCost:
    """Parameters and training FLOPs per token of ``TransformerLM(**kw)`` at ``seq_len``.

    Parameter layout (the state-dict keys of DESIGN.md): token_embeddings V*d; per layer
    ln1 d, q/k/v/output_proj 4*d*d, ln2 d, SwiGLU w1/w2/w3 3*d*d_ff; ln_final d; lm_head V*d.
    """
    v, d, n_layers, d_ff = int(kw["vocab_size"]), int(kw["d_model"]), int(kw["num_layers"]), int(kw["d_ff"])
    t = int(seq_len if seq_len is not None else kw["context_length"])
    per_layer_matmul = 4 * d * d + 3 * d * d_ff
    params_matmul = n_layers * per_layer_matmul + v * d  # + lm_head
    params = params_matmul + v * d + n_layers * 2 * d + d  # + embeddings, ln1/ln2, ln_final
    attention = 12.0 * n_layers * t * d
    return ModelCost(params, params_matmul, 6.0 * params_matmul + attention, attention)


def activation_bytes(kw: dict[str, Any], batch_size: int, seq_len: int, bytes_per_act: int) -> int:
    """Activations kept for backward, counted tensor by tensor (an estimate, not a profile).

    Per layer and token: RMSNorm inputs 2d, q/k/v inputs d, rotated q and k 2d, v d,
    attention output d, FFN input d, SwiGLU's w1 and w3 outputs, silu and product 4*d_ff,
    and per head the softmax probabilities and masked scores 2*heads*seq_len. After the
    stack: ln_final and lm_head inputs 2d, logits and log-softmax 2V.
    """
    v, d, d_ff = int(kw["vocab_size"]), int(kw["d_model"]), int(kw["d_ff"])
    per_layer = 8 * d + 4 * d_ff + 2 * int(kw["num_heads"]) * seq_len
    per_token = int(kw["num_layers"]) * per_layer + 2 * d + 2 * v
    return per_token * batch_size * seq_len * bytes_per_act


@dataclass
class Plan:
    """What ``lmdata plan`` prints: the model's cost and the token rate an accelerator needs."""

    preset: str
    gpu: str
    mfu: float
    batch_size: int
    seq_len: int
    vocab_size: int
    params: int
    params_matmul: int
    flops_per_token: float
    attention_flops_per_token: float
    memory_params_bytes: int
    memory_grads_bytes: int
    memory_optimizer_bytes: int
    memory_activations_bytes: int
    memory_total_bytes: int
    peak_flops: float
    tokens_per_s_needed: float
    step_ms: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def plan(
    name: str, gpu: str, batch_size: int, seq_len: int, vocab_size: int, mfu: float = DEFAULT_MFU,
    bytes_per_act: int = 2, sizes: dict[str, int] | None = None,
) -> Plan:
    """Cost of training preset ``name`` on ``gpu``: the tokens/s a loader must sustain, the step time.

    Memory assumes fp32 master weights, fp32 gradients, AdamW's two fp32 moments and bf16
    activations (``bytes_per_act=2``); no activation checkpointing.
    """
    if not 0 < mfu <= 1:
        raise LmdataError(f"--mfu {mfu}: must be in (0, 1], e.g. 0.4 for 40%")
    if batch_size < 1 or seq_len < 1:
        raise LmdataError(f"--batch-size {batch_size} / --seq-len {seq_len}: both must be >= 1")
    kw = {**model_kwargs(name, vocab_size, seq_len), **(sizes or {})}  # sizes: train's size flags, as kwargs
    cost = model_cost(kw, seq_len)
    peak = accelerator_flops(gpu)
    needed = mfu * peak / cost.flops_per_token
    acts = activation_bytes(kw, batch_size, seq_len, bytes_per_act)
    p = cost.params
    return Plan(
        preset=name, gpu=gpu.lower(), mfu=mfu, batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size,
        params=p, params_matmul=cost.params_matmul, flops_per_token=cost.flops_per_token,
        attention_flops_per_token=cost.attention_flops_per_token,
        memory_params_bytes=4 * p, memory_grads_bytes=4 * p, memory_optimizer_bytes=8 * p,
        memory_activations_bytes=acts, memory_total_bytes=BYTES_PER_PARAM_TRAINING * p + acts,
        peak_flops=peak, tokens_per_s_needed=needed, step_ms=1000.0 * batch_size * seq_len / needed,
    )


def format_plan(p: Plan) -> str:
    """The plan as a few aligned lines for the terminal."""
    gib = 1024**3
    rows = [
        ("model", f"{p.preset} (vocab {p.vocab_size}, seq_len {p.seq_len})"),
        ("parameters", f"{p.params:,} ({p.params_matmul:,} in matmuls)"),
        ("FLOPs/token", f"{p.flops_per_token:.4g} (6*N_matmul {6 * p.params_matmul:.4g} "
                        f"+ attention {p.attention_flops_per_token:.4g})"),
        ("memory", f"{p.memory_total_bytes / gib:.2f} GiB = params {p.memory_params_bytes / gib:.2f} "
                   f"+ grads {p.memory_grads_bytes / gib:.2f} + AdamW {p.memory_optimizer_bytes / gib:.2f} "
                   f"+ activations {p.memory_activations_bytes / gib:.2f} (batch {p.batch_size}, bf16)"),
        ("accelerator", f"{p.gpu}: {p.peak_flops / 1e12:.0f} TFLOP/s bf16 peak, MFU {p.mfu:.0%}"),
        ("tokens/s needed", f"{p.tokens_per_s_needed:,.0f}"),
        ("step time", (f"{p.step_ms:.2f}" if p.step_ms >= 1 else f"{p.step_ms:.3g}")  # (tiny's had read 0.00)
         + f" ms for {p.batch_size} x {p.seq_len} tokens"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
