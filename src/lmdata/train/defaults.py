"""Per-preset training defaults and the resolution of a TrainConfig's "use the default" values.

A TrainConfig field left at its sentinel (``lr`` 0, ``warmup`` -1, ``batch_size`` 0,
``min_lr`` -1, ``precision`` auto, size flags 0) takes the value chosen here, so a flag or
TOML key always wins and ``--model small`` alone starts from values that learn.

Where the numbers come from (bench/README.md, "Training defaults", has the table and the
command): ``tiny`` from a sweep of lr x warm-up x batch on the shipped sample (300 steps,
CPU); ``small`` and ``gpt2-small`` by the usual scaling of the peak rate with width
(nanoGPT trains GPT-2 small at 6e-4; ~17 M-parameter TinyStories models train at 1-3e-3),
not swept here (no GPU in the sessions that chose them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lmdata.errors import LmdataError

# preset -> lr (peak), warmup (steps), batch_size (sequences per micro-batch per rank)
TRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": dict(lr=1e-2, warmup=20, batch_size=32),
    "small": dict(lr=2e-3, warmup=100, batch_size=32),
    "gpt2-small": dict(lr=6e-4, warmup=700, batch_size=16),
}
FALLBACK = dict(lr=1e-3, warmup=100, batch_size=16)  # a preset added without a sweep

# TrainConfig size flag -> TransformerLM keyword
SIZE_FLAGS = {"d_model": "d_model", "layers": "num_layers", "heads": "num_heads", "d_ff": "d_ff",
              "context": "context_length"}


def resolve(cfg: Any, device_type: str = "cpu") -> Any:
    """``cfg`` with every sentinel replaced by its preset default (a new TrainConfig)."""
    d = TRAIN_DEFAULTS.get(cfg.model, FALLBACK)
    lr = cfg.lr or d["lr"]
    changes = dict(
        lr=lr,
        warmup=d["warmup"] if cfg.warmup < 0 else cfg.warmup,
        batch_size=cfg.batch_size or d["batch_size"],
        min_lr=lr / 10 if cfg.min_lr < 0 else cfg.min_lr,
        precision=("bf16" if device_type == "cuda" else "fp32") if cfg.precision == "auto" else cfg.precision,
    )
    if changes["min_lr"] > lr:
        raise LmdataError(f"--min-lr {changes['min_lr']} is above the peak --lr {lr}; lower --min-lr")
    return dataclasses.replace(cfg, **changes)


def model_overrides(cfg: Any) -> dict[str, int]:
    """The size flags that were set, as TransformerLM keyword arguments."""
    return {kw: getattr(cfg, name) for name, kw in SIZE_FLAGS.items() if getattr(cfg, name)}


def build_model_config(cfg: Any, vocab_size: int) -> dict[str, Any]:
    """The preset's constructor kwargs with the size flags and the store's vocabulary applied."""
    from lmdata.model.transformer import model_config

    mcfg = model_config(cfg.model, vocab_size=vocab_size, **model_overrides(cfg))
    if mcfg["d_model"] % mcfg["num_heads"] or (mcfg["d_model"] // mcfg["num_heads"]) % 2:
        raise LmdataError(
            f"--d-model {mcfg['d_model']} / --heads {mcfg['num_heads']}: heads must divide d_model into an even "
            "head size (RoPE rotates pairs); pick e.g. --heads "
            f"{next((h for h in (8, 4, 2, 1) if mcfg['d_model'] % (2 * h) == 0), 1)}"
        )
    return mcfg
