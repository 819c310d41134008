"""The ``[train]`` section of a pipeline TOML as a dataclass whose fields carry their help.

The same fields are the ``lmdata train`` flags (``batch_size`` -> ``--batch-size``); a
flag overrides the TOML value. Example::

    [train]
    store = "runs/sample-store"
    model = "tiny"
    batch_size = 16
    steps = 200
    out = "runs/sample-train"
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lmdata.errors import LmdataError

DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = ("auto", "fp32", "bf16")


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


# Fields whose TOML/CLI value is not a scalar of the default's type (parsed by their owners).
SPECIAL = ("mix",)


@dataclass
class TrainConfig:
    store: str = _f("", "Store directory written by `lmdata ingest` (default: [ingest].out of the pipeline).")
    split: str = _f("train", "Split to train on.")
    val_split: str = _f("auto", "Validation split: auto = `validation` when the store has it; none = no validation.")
    format: str = _f("", "Store format to read (memmap, parquet, lance, ...); empty = the store's default.")
    model: str = _f("tiny", "Model preset (see lmdata.model.transformer.PRESETS); vocab_size comes from the store.")
    d_model: int = _f(0, "Model width over the preset's; 0 = the preset's.")
    layers: int = _f(0, "Transformer blocks over the preset's; 0 = the preset's.")
    heads: int = _f(0, "Attention heads over the preset's (must divide --d-model); 0 = the preset's.")
    d_ff: int = _f(0, "SwiGLU hidden width over the preset's; 0 = the preset's.")
    context: int = _f(0, "Model context_length over the preset's; 0 = the preset's.")
    seq_len: int = _f(0, "Training context length; 0 = the model's context_length (must not exceed it).")
    batch_size: int = _f(0, "Sequences per micro-batch per rank; 0 = the preset's (lmdata.train.defaults).")
    grad_accum: int = _f(1, "Micro-batches per optimizer step (gradient accumulation); a step sees "
                         "batch_size x grad_accum sequences per rank.")
    mix: list = _f(None, "Train on a weighted mixture instead of --store/--split: STORE[:SPLIT]=WEIGHT, repeated "
                   "(TOML: [train.mix.NAME] tables of store, split, weight); every store needs the same tokenizer.")
    steps: int = _f(200, "Optimizer steps (ignored when --tokens is set).")
    tokens: int = _f(0, "Train for this many tokens instead of --steps (all ranks together).")
    lr: float = _f(0.0, "Peak learning rate; 0 = the preset's (lmdata.train.defaults, from bench/README.md's sweep).")
    min_lr: float = _f(-1.0, "Learning rate at the end of the cosine decay; -1 = lr / 10.")
    warmup: int = _f(-1, "Linear warm-up steps; -1 = the preset's.")
    weight_decay: float = _f(0.1, "AdamW decoupled weight decay (matrices only; norm gains are not decayed).")
    beta1: float = _f(0.9, "AdamW beta1.")
    beta2: float = _f(0.95, "AdamW beta2.")
    grad_clip: float = _f(1.0, "Clip the global gradient L2 norm to this; 0 = no clipping.")
    seed: int = _f(0, "Seed of the model init and the data order.")
    device: str = _f("auto", f"One of {', '.join(DEVICES)}; auto = cuda, then mps, then cpu.")
    precision: str = _f("auto", f"One of {', '.join(PRECISIONS)}; auto = bf16 autocast on CUDA, fp32 elsewhere "
                        "(weights stay fp32).")
    gpu: str = _f("", "Accelerator whose peak FLOP/s the MFU is measured against (lmdata.bench.flops.ACCELERATORS); "
                  "empty = guessed from the CUDA device name, none on CPU.")
    fast: bool = _f(False, "Fast path: torch's fused scaled_dot_product_attention kernel.")
    compile: bool = _f(False, "Fast path: torch.compile the model (slow first step; needs a C compiler on CPU).")
    eval_every: int = _f(100, "Validate every N steps (and at the end); 0 = only at the end.")
    eval_batches: int = _f(10, "Batches per validation.")
    ckpt_every: int = _f(100, "Checkpoint every N steps (and at the end); 0 = only at the end.")
    keep: int = _f(3, "Keep the newest K checkpoints; 0 = keep all.")
    log_every: int = _f(10, "Log loss, lr, grad norm, tokens/s and data-wait every N steps.")
    out: str = _f("runs/train", "Output folder: checkpoints/, metrics.jsonl, loss.png.")
    resume: bool = _f(False, "Continue from the newest checkpoint in --out.")
    workers: int = _f(0, "Loader worker processes per rank (0 = read in the training process).")
    prefetch: int = _f(2, "Reads each worker does ahead (a read is --batches-per-read batches).")
    batches_per_read: int = _f(4, "Consecutive batches read with one call (one Lance take); 1 = evenly spread waits.")
    doc_mask: bool = _f(False, "Attention stays inside documents; RoPE positions restart per document.")
    progress: bool = _f(True, "Show a progress bar.")

    def check(self) -> None:
        """Values that parse but cannot work: name the flag and what is allowed."""
        if self.device not in DEVICES:
            raise LmdataError(f"--device: {self.device!r} is not one of {', '.join(DEVICES)}")
        if self.precision not in PRECISIONS:
            raise LmdataError(f"--precision: {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if not self.store and not self.mix:
            raise LmdataError("--store: no store given; pass --store DIR or set store in the pipeline's [train]")
        for name in ("grad_accum", "log_every", "eval_batches", "prefetch", "batches_per_read"):
            if getattr(self, name) < 1:
                raise LmdataError(f"--{flag(name)}: must be >= 1, got {getattr(self, name)}")
        for name in ("steps", "tokens", "eval_every", "ckpt_every", "keep", "workers", "seq_len", "batch_size",
                     "d_model", "layers", "heads", "d_ff", "context"):
            if getattr(self, name) < 0:
                raise LmdataError(f"--{flag(name)}: must be >= 0, got {getattr(self, name)}")
        if self.warmup < -1:
            raise LmdataError(f"--warmup: must be >= 0 (or -1 = the preset's), got {self.warmup}")
        if self.lr < 0 or (self.lr > 0 and self.min_lr > self.lr):
            raise LmdataError(f"--lr/--min-lr: need 0 <= min_lr <= lr and lr > 0, got {self.lr} / {self.min_lr}")


def flag(name: str) -> str:
    return name.replace("_", "-")


def help_text() -> dict[str, str]:
    return {f.name: f.metadata["help"] for f in dataclasses.fields(TrainConfig)}


def train_config_from_table(table: Any, where: str = "[train]", **defaults: Any) -> TrainConfig:
    """A TOML ``[train]`` table -> TrainConfig; unknown keys and wrong types name the key."""
    if not isinstance(table, dict):
        raise LmdataError(f"{where}: expected a table, got {type(table).__name__}")
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    values = dict(defaults)
    for key, value in table.items():
        if key == "mix":
            from lmdata.data.mixed import parse_mix_table

            values[key] = parse_mix_table(value, f"{where}.mix")
            continue
        if key not in fields:
            raise LmdataError(f"{where}: unknown key {key!r} (known: {', '.join(fields)})")
        want = type(fields[key].default)
        ok = isinstance(value, want) and (want is bool or not isinstance(value, bool))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok:
            raise LmdataError(f"{where}.{key}: expected {want.__name__}, got {value!r}")
        values[key] = value
    return TrainConfig(**values)


def load_train_config(pipeline_path: str) -> TrainConfig:
    """The ``[train]`` section of a pipeline file; ``store`` defaults to ``[ingest].out``."""
    from lmdata.config import load_pipeline

    pipe = load_pipeline(pipeline_path)
    table = pipe.sections.get("train", {})
    defaults = {"store": pipe.ingest.out} if pipe.ingest is not None and pipe.ingest.out else {}
    return train_config_from_table(table, f"pipeline {pipeline_path}: [train]", **defaults)
