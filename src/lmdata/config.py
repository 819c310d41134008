"""Pipeline files (``pipelines/*.toml``) -> one small dataclass per section, one parser.

Each field carries its help text (``field(metadata={"help": ...})``): the same fields are
the flags of the section's command (``batch_size`` -> ``--batch-size``, ``lmdata.cli``
derives them), so each default is written once, here. ``build`` is the one parser: a
short recursive function from a TOML table to a dataclass that rejects unknown keys and
wrong types, naming them. ``parse_pipeline`` checks ``[tokenizer]`` and ``[ingest]`` at
once; the other sections (``[train]``, ``[bench]``, ``[sample]``, later ``[mix]``) are
kept as tables in ``PipelineConfig.sections`` and built by their command through
``PipelineConfig.section`` (so ``lmdata ingest`` does not fail on a ``[bench]`` typo).
Below a job's entry point, functions take plain values, never these objects.
Relative paths written in a pipeline file are relative to the file's directory (so
``pipelines/sample.toml`` says ``../data/sample.txt``), whatever directory ``lmdata`` runs in;
command-line flags and built-in defaults stay relative to the working directory.
"""

from __future__ import annotations

import dataclasses
import math
import os
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package
    import tomli as tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmdata.errors import LmdataError
from lmdata.model.presets import PRESETS
from lmdata.sources import DEFAULT_SEPARATOR, ERRORS, KINDS

BATCHES_PER_READ = 4  # consecutive batches read with one call: the loader's, train's and bench's default
DEVICES = ("auto", "cpu", "cuda", "mps")
PRECISIONS = ("auto", "fp32", "bf16")
COMPUTE = ("simulated", "model")
ENGINES = ("local", "ray")
MAX_LOCAL_WORKERS = 1024  # the local engine's encoder threads (or processes): 100,000 failed starting threads
CACHE = ("warm", "cold")
TRACKERS = ("jsonl", "tensorboard", "wandb")  # lmdata train --log (lmdata.train.trackers)


def _field(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field with its help text (the CLI and the pipeline docs read it from the metadata)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **meta})
    return field(default=default, metadata={"help": help, **meta})


def local_out(value: str, what: str) -> str:
    """An output that is a local directory: ``file:///ABS`` -> ``/ABS``; ``s3://`` (or ``s3:/x``) refused,
    so a run never writes a local tree named ``s3:``."""
    if not isinstance(value, str) or ":" not in value:
        return value
    from lmdata.io.location import local_dir

    return str(local_dir(value, flag="--out", what=what))


def flag(name: str, cls: type | None = None) -> str:
    """The command-line flag of a field: ``batch_size`` -> ``batch-size`` (or its ``flag`` metadata in ``cls``)."""
    if cls is not None:
        f = next((f for f in dataclasses.fields(cls) if f.name == name), None)
        if f is not None and "flag" in f.metadata:
            return f.metadata["flag"]
    return name.replace("_", "-")


def check_finite(cfg: Any) -> None:
    """Every float field of ``cfg`` a finite number: NaN passed every ``< 0`` check (--step-ms nan had been a
    64-line traceback, --lr nan a run of NaN losses), inf overflowed a timer."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise LmdataError(f"--{flag(f.name, type(cfg))} {value}: give a finite number")


# ---------------------------------------------------------------------------- [tokenizer], [ingest]


@dataclass
class TokenizerConfig:
    dir: str = _field("", "Saved tokenizer directory; used as is if it exists, else trained into it.", path=True)
    train_files: list[str] = _field([], "Text files or s3:// objects (or globs; .gz/.zst too) to train a BPE tokenizer on "
                                "when `dir` does not exist yet.",
                                path=True)
    vocab_size: int = _field(0, "Vocabulary size when training (256 bytes + merges + special tokens).")
    special_tokens: list[str] = _field([DEFAULT_SEPARATOR], "Special tokens when training; the last is end-of-text.")


@dataclass
class SplitConfig:
    sources: list[str] = _field([], "Input files or globs, read in this order (each glob sorted).", path=True)
    kind: str = _field("auto", f"How to cut files into documents: {', '.join(KINDS)} (auto: by extension).",
                   choices=KINDS)
    separator: str = _field(DEFAULT_SEPARATOR, "kind=text: the line that separates documents.")
    text_field: str = _field("text", "kind=jsonl/parquet/arrow: the field or column holding the document text.")


@dataclass
class HoldoutConfig:
    documents: int = _field(0, "How many documents, taken from the END of `from`'s sources, form split `to`.")
    from_split: str = _field("train", "The split the held-out documents are taken from (TOML key: `from`).", toml="from")
    to: str = _field("validation", "The name of the held-out split.")


@dataclass
class IngestConfig:
    out: str = _field("", "The store directory to write.", path=True)
    formats: list[str] = _field([], "Formats to write, all from the same token stream (comma-separated on the command "
                            "line); empty = memmap, parquet, lance.", flag="format")
    shard_tokens: int = _field(1 << 20, "Tokens per shard (shards end at document boundaries; one long document may exceed it).")
    workers: int = _field(0, "Encoder threads (processes for a custom-regex tokenizer); 0 = all cores. "
                         "The store does not depend on it.")
    errors: str = _field("strict", f"Invalid UTF-8: {' or '.join(ERRORS)} (replace counts each U+FFFD in the summary).",
                     choices=ERRORS)
    engine: str = _field("local", "Where to tokenize and write: local (this machine) or ray (a Ray cluster, "
                     "`pip install 'lmdata[ray]'`); the store is the same.", choices=ENGINES)
    ray_address: str = _field("", "engine = \"ray\": the cluster to join (auto, HOST:6379, ray://HOST:10001); "
                          "empty = start a local Ray.")
    splits: dict[str, SplitConfig] = _field({}, "[ingest.splits.NAME] tables: the documents of each split.")
    holdout: HoldoutConfig | None = _field(None, "[ingest.holdout]: move the last N documents of a split into another.")


# ---------------------------------------------------------------------------- [train], [bench], [sample]


@dataclass
class TrainConfig:
    store: str = _field("", "Store directory written by `lmdata ingest` (default: [ingest].out of the pipeline).",
                    path=True)
    split: str = _field("train", "Split to train on.")
    val_split: str = _field("auto", "Validation split: auto = `validation` when the store has it; none = no validation.")
    format: str = _field("", "Store format to read (memmap, parquet, lance, ...); empty = the store's default.")
    model: str = _field("tiny", f"Model preset: {', '.join(PRESETS)}; vocab_size comes from the store.")
    d_model: int = _field(0, "Model width over the preset's; 0 = the preset's.")
    layers: int = _field(0, "Transformer blocks over the preset's; 0 = the preset's.")
    heads: int = _field(0, "Attention heads over the preset's (must divide --d-model); 0 = the preset's.")
    d_ff: int = _field(0, "SwiGLU hidden width over the preset's; 0 = the preset's.")
    context: int = _field(0, "Model context_length over the preset's; 0 = the preset's.")
    seq_len: int = _field(0, "Training context length; 0 = the model's context_length (must not exceed it).")
    batch_size: int = _field(0, "Sequences per micro-batch per rank; 0 = the preset's (lmdata.train.defaults).")
    grad_accum: int = _field(1, "Micro-batches per optimizer step (gradient accumulation); a step sees "
                         "batch_size x grad_accum sequences per rank.")
    mix: list | None = _field(None, "Train on a weighted mixture instead of --store/--split: STORE[:SPLIT]=WEIGHT, "
                          "repeated (TOML: [train.mix.NAME] tables of store, split, weight); every store needs "
                          "the same tokenizer.", parse="lmdata.data.mixed:parse_mix_table",
                          cli="lmdata.data.mixed:parse_mix_flag", metavar="STORE[:SPLIT]=WEIGHT", path=True)
    steps: int = _field(200, "Optimizer steps (ignored when --tokens is set).")
    tokens: int = _field(0, "Train for this many tokens instead of --steps (all ranks together).")
    lr: float = _field(0.0, "Peak learning rate; 0 = the preset's (lmdata.train.defaults, from bench/README.md's sweep).")
    min_lr: float = _field(-1.0, "Learning rate at the end of the cosine decay; -1 = lr / 10.")
    warmup: int = _field(-1, "Linear warm-up steps; -1 = the preset's.")
    weight_decay: float = _field(0.1, "AdamW decoupled weight decay (matrices only; norm gains are not decayed).")
    beta1: float = _field(0.9, "AdamW beta1.")
    beta2: float = _field(0.95, "AdamW beta2.")
    grad_clip: float = _field(1.0, "Clip the global gradient L2 norm to this; 0 = no clipping.")
    seed: int = _field(0, "Seed of the model init and the data order.")
    device: str = _field("auto", f"One of {', '.join(DEVICES)}; auto = cuda, then mps, then cpu.")
    precision: str = _field("auto", f"One of {', '.join(PRECISIONS)}; auto = bf16 autocast on CUDA, fp32 elsewhere "
                        "(weights stay fp32).")
    gpu: str = _field("", "Accelerator whose peak FLOP/s the MFU is measured against (lmdata.model.flops.ACCELERATORS); "
                  "empty = guessed from the CUDA device name, none on CPU.")
    fast: bool = _field(False, "Fast path: torch's fused scaled_dot_product_attention kernel.")
    compile: bool = _field(False, "Fast path: torch.compile the model (slow first step; needs a C compiler on CPU).")
    eval_every: int = _field(100, "Validate every N steps (and at the end); 0 = only at the end.")
    eval_batches: int = _field(10, "Batches per validation.")
    ckpt_every: int = _field(100, "Checkpoint every N steps (and at the end); 0 = only at the end.")
    keep: int = _field(3, "Keep the newest K checkpoints; 0 = keep all.")
    log_every: int = _field(10, "Log loss, lr, grad norm, tokens/s and data-wait every N steps.")
    out: str = _field("runs/train", "Output folder: checkpoints/, metrics.jsonl, loss.png.", path=True)
    resume: bool = _field(False, "Continue from the newest checkpoint in --out.")
    workers: int = _field(0, "Loader worker processes per rank (0 = read in the training process); TOML key: workers.",
                      flag="loader-workers", was="workers")
    prefetch: int = _field(2, "Reads each worker does ahead (a read is --batches-per-read batches).")
    batches_per_read: int = _field(BATCHES_PER_READ, "Consecutive batches read with one call (one Lance take); 1 = evenly spread waits.")
    doc_mask: bool = _field(False, "Attention stays inside documents; RoPE positions restart per document.")
    progress: bool = _field(True, "Progress on stderr: a bar on a terminal, a line every few seconds in a log.")
    log: list[str] = _field(["jsonl"], "Trackers the logged scalars go to, comma-separated: jsonl (metrics.jsonl, "
                            "always written), tensorboard (OUT/tensorboard), wandb (OUT/wandb; honours WANDB_MODE="
                            "offline); tensorboard and wandb need `pip install 'lmdata[track]'`.")

    def __post_init__(self) -> None:
        self.out = local_out(self.out, "a training run")

    def check(self) -> None:
        """Values that parse but cannot work: name the flag and what is allowed."""
        check_finite(self)
        if self.device not in DEVICES:
            raise LmdataError(f"--device: {self.device!r} is not one of {', '.join(DEVICES)}")
        if self.precision not in PRECISIONS:
            raise LmdataError(f"--precision: {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if not self.store and not self.mix:
            raise LmdataError("--store: no store given; pass --store DIR or set store in the pipeline's [train]")
        for name in ("grad_accum", "log_every", "eval_batches", "prefetch", "batches_per_read"):
            if getattr(self, name) < 1:
                raise LmdataError(f"--{flag(name, TrainConfig)}: must be >= 1, got {getattr(self, name)}")
        for name in ("steps", "tokens", "eval_every", "ckpt_every", "keep", "workers", "seq_len", "batch_size",
                     "d_model", "layers", "heads", "d_ff", "context"):
            if getattr(self, name) < 0:
                raise LmdataError(f"--{flag(name, TrainConfig)}: must be >= 0, got {getattr(self, name)}")
        if self.steps == 0 and self.tokens == 0:
            raise LmdataError("--steps: must be >= 1, got 0 (or give --tokens)")
        if bad := [name for name in self.log if name not in TRACKERS]:
            raise LmdataError(f"--log {bad[0]!r}: not a tracker; choose from {', '.join(TRACKERS)} (comma-separated)")
        if self.warmup < -1:
            raise LmdataError(f"--warmup: must be >= 0 (or -1 = the preset's), got {self.warmup}")
        if self.lr < 0 or (self.lr > 0 and self.min_lr > self.lr):
            raise LmdataError(f"--lr/--min-lr: need 0 <= min_lr <= lr and lr > 0, got {self.lr} / {self.min_lr}")
        if self.gpu:  # before --out is made (it had been checked after)
            from lmdata.model.flops import accelerator_flops

            accelerator_flops(self.gpu)


@dataclass
class BenchConfig:
    """``[bench]`` and the ``lmdata bench`` flags (``run_bench`` takes it)."""

    store: str = _field("", "Store directory (from `lmdata ingest`); in a pipeline: [ingest].out.", path=True)
    out: str = _field("", "Folder for bench.json, table.txt, stall.png, waits.png (pipeline default: <store>-bench).",
                  path=True)
    split: str = _field("train", "Split to read.")
    formats: list[str] = _field([], "Formats to compare (a comma-separated list on the command line); empty = every "
                            "format of the store.", flag="format")
    workers: list[int] = _field([0, 1, 2], "Loader worker counts to try (comma-separated on the command line); "
                            "TOML key: workers.", flag="loader-workers", was="workers")
    batch_size: int = _field(32, "Sequences per step.")
    seq_len: int = _field(256, "Tokens per sequence.")
    steps: int = _field(100, "Steady-state steps per repeat, after the first step and the warm-up (capped at one "
                        "epoch of the split).")
    warmup_steps: int = _field(-1, "Steps after the first left out of the steady-state stall and reported apart; "
                               "-1 = the batches the loader has in flight at start (workers x prefetch x "
                               "batches_per_read, at least batches_per_read), and more while a reader (or a "
                               "worker's) still opens its split behind the first batch.")
    repeats: int = _field(3, "Runs of each cell: the stall is their median, the spread their min-max, and the "
                          "verdict 'too noisy' when they fall on both sides of the 5% threshold.")
    compute: str = _field("simulated", "simulated: a fixed-duration step that releases the GIL; model: real training "
                      "steps.", choices=COMPUTE)
    step_ms: float | None = _field(None, "Simulated step time in ms; default: derived from model and gpu.")
    model: str = _field("small", f"Model preset ({', '.join(PRESETS)}) whose token rate the loader must keep up with "
                    "(and --compute model).")
    gpu: str = _field("h100", "Accelerator whose token rate the loader must keep up with (see `lmdata plan --help`); "
                  "empty = none.")
    mfu: float = _field(0.4, "Model FLOP utilization assumed on gpu.")
    cache: list[str] = _field(["warm"], "Page cache before each run: files read once (warm), evicted (cold), or both.",
                          choices=("warm", "cold", "both"))
    prefetch: int = _field(2, "Reads each worker does ahead (a read is batches_per_read batches).")
    batches_per_read: int = _field(BATCHES_PER_READ, "Consecutive batches read with one call (one Lance take); "
                               "1 = evenly spread waits.")
    seed: int = _field(0, "Seed of the batch order.")
    device: str = _field("auto", "auto, cpu or cuda[:N].")

    def __post_init__(self) -> None:
        self.out = local_out(self.out, "a bench report")
        if isinstance(self.cache, str):
            self.cache = [self.cache]
        if "both" in self.cache:  # the CLI's --cache both, also accepted from a pipeline's [bench]
            self.cache = ["warm", "cold"]

    def check(self) -> None:
        """Reject flag values that cannot run, naming the flag."""
        check_finite(self)
        self.formats, self.workers, self.cache = (list(dict.fromkeys(v)) for v in (self.formats, self.workers, self.cache))
        if self.compute not in COMPUTE:
            raise LmdataError(f"--compute {self.compute!r}: choose one of {', '.join(COMPUTE)}")
        if bad := [c for c in self.cache if c not in CACHE]:
            raise LmdataError(f"--cache {bad[0]!r}: choose warm, cold or both")
        if not self.workers or min(self.workers) < 0:
            raise LmdataError(f"--loader-workers {self.workers}: give worker counts >= 0, e.g. 0,1,2")
        if self.steps < 2:
            raise LmdataError(f"--steps {self.steps}: need at least 2 steady-state steps per repeat")
        if self.warmup_steps < -1:
            raise LmdataError(f"--warmup-steps {self.warmup_steps}: must be >= 0 (or -1 = auto)")
        if self.repeats < 1:
            raise LmdataError(f"--repeats {self.repeats}: must be >= 1 (3 or more show the spread)")
        if self.batch_size < 1 or self.seq_len < 1:
            raise LmdataError(f"--batch-size {self.batch_size} / --seq-len {self.seq_len}: must be >= 1")
        if self.compute == "simulated" and self.step_ms is None and not self.gpu:
            raise LmdataError("--compute simulated needs --step-ms X, or --gpu NAME to derive it from --model")
        if self.step_ms is not None and self.step_ms < 0:
            raise LmdataError(f"--step-ms {self.step_ms}: must be >= 0")
        if self.prefetch < 1:
            raise LmdataError(f"--prefetch {self.prefetch}: must be >= 1 (reads each worker does ahead)")
        if self.batches_per_read < 1:
            raise LmdataError(f"--batches-per-read {self.batches_per_read}: must be >= 1 (batches read with one call)")
        if self.compute == "model" or self.gpu:
            from lmdata.model.presets import get_preset

            get_preset(self.model)  # an unknown --model fails here, not inside a cell



@dataclass
class SampleConfig:
    """``[sample]``: what ``lmdata sample`` generates from the final checkpoint."""

    prompt: str = _field("Once upon a time", "Text to continue.")
    max_tokens: int = _field(120, "Most new tokens (stops earlier at end-of-text).")
    temperature: float = _field(0.8, "Softmax temperature; 0 = greedy.")
    top_p: float = _field(0.95, "Nucleus sampling mass.")
    seed: int = _field(0, "Sampling seed.")


# ---------------------------------------------------------------------------- the pipeline


@dataclass
class PipelineConfig:
    tokenizer: TokenizerConfig | None = None
    ingest: IngestConfig | None = None
    sections: dict[str, Any] = field(default_factory=dict)  # [train], [bench], [sample], ...: see ``section``
    path: str = ""

    def section(self, cls: type, name: str, **defaults: Any) -> Any:
        """Section ``[name]`` built as ``cls`` (``defaults`` fill keys the file leaves out; paths in the file
        are relative to the file)."""
        table = self.sections.get(name, {})
        built = build(cls, table, f"pipeline {self.path}: [{name}]", base=pipeline_dir(self.path))
        return dataclasses.replace(built, **{k: v for k, v in defaults.items() if k not in table})


def pipeline_dir(path: str) -> str | None:
    """The directory a pipeline file's relative paths start from (None: not from a file)."""
    return os.path.dirname(path) if path and path != "pipeline" else None


def rebase(value: Any, base: str | None) -> Any:
    """A path field's value (a path, a list of paths or globs, ``[train.mix]`` entries) relative to ``base``.

    Absolute paths and URIs (``s3://...``) stay as they are; ``pipelines/../runs/x`` reads ``runs/x``.
    """
    if not base:
        return value
    if isinstance(value, list):
        return [rebase(v, base) for v in value]
    if isinstance(value, dict) and "store" in value:
        return {**value, "store": rebase(value["store"], base)}
    if isinstance(value, str) and value and "://" not in value and not os.path.isabs(os.path.expanduser(value)):
        return os.path.normpath(os.path.join(base, value))
    return value


def build(cls: type, table: Any, where: str, base: str | None = None) -> Any:
    """Construct ``cls`` from a TOML table: unknown keys and wrong types are errors naming them.

    Fields that are dataclasses, or ``dict[str, <dataclass>]``, are built recursively
    (``[ingest.holdout]``, ``[ingest.splits.NAME]``); a field's TOML key is its name or
    its ``toml`` metadata (``from`` for ``from_split``).
    """
    if not isinstance(table, dict):
        raise LmdataError(f"{where}: expected a table, got {type(table).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.metadata.get("toml", f.name): f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in table.items():
        if key not in fields:
            raise LmdataError(f"{where}: unknown key {key!r} (known: {', '.join(fields)})")
        name = fields[key].name
        parse = fields[key].metadata.get("parse")  # a field whose TOML form is its own ([train.mix])
        values[name] = resolve(parse)(value, f"{where}.{key}") if parse else _value(hints[name], value, where, key, base)
        if fields[key].metadata.get("path"):
            values[name] = rebase(values[name], base)
    return cls(**values)


def resolve(path: str) -> Any:
    """``"module:function"`` -> the function (imported late: config.py imports nothing heavy)."""
    import importlib

    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _value(hint: Any, value: Any, where: str, key: str, base: str | None = None) -> Any:
    """One TOML value checked against a field's type hint."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # `X | None`: a TOML value is never None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return build(hint, value, f"{where[:-1]}.{key}]", base)
    if origin is dict and args and dataclasses.is_dataclass(args[1]):
        if not isinstance(value, dict):
            raise LmdataError(f"{where}.{key}: expected [{where.rsplit('[', 1)[-1][:-1]}.{key}.NAME] tables")
        return {n: build(args[1], t, f"{where[:-1]}.{key}.{n}]", base) for n, t in value.items()}
    want = origin or hint
    if want is Any:
        return value
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
        raise LmdataError(f"{where}.{key}: expected {want.__name__}, got {value!r}")
    return value


SECTIONS = ("train", "bench", "sample")  # a pipeline's sections besides [tokenizer] and [ingest]


def parse_pipeline(obj: dict[str, Any], where: str = "pipeline") -> PipelineConfig:
    """A parsed TOML document -> PipelineConfig (``[tokenizer]`` and ``[ingest]`` checked).

    ``where`` is the file's path: the relative paths written in it are relative to its directory.
    """
    cfg = PipelineConfig(path=where)
    base = pipeline_dir(where)
    for name, table in obj.items():
        if name == "tokenizer":
            cfg.tokenizer = build(TokenizerConfig, table, f"{where}: [tokenizer]", base)
        elif name == "ingest":
            cfg.ingest = build(IngestConfig, table, f"{where}: [ingest]", base)
            check_ingest(cfg.ingest, f"{where}: [ingest]")
        elif name in SECTIONS:
            cfg.sections[name] = table
        else:  # (a misspelt [ingestt] had been ignored, and its settings with it)
            raise LmdataError(f"{where}: unknown top-level entry {name!r}; the sections are "
                              f"{', '.join(f'[{n}]' for n in ('tokenizer', 'ingest', *SECTIONS))}")
    return cfg


def check_ingest(cfg: IngestConfig, where: str = "ingest") -> None:
    """Values that parse but cannot work: name the key and the allowed values."""
    from lmdata.store.manifest import check_split_name  # here: it imports numpy

    def key(name: str) -> str:  # the command line's flag, or the pipeline's key
        return f"--{flag(name, IngestConfig)}" if where == "ingest" else name

    if cfg.shard_tokens < 1:
        raise LmdataError(f"{where}: {key('shard_tokens')} must be positive, got {cfg.shard_tokens}")
    if cfg.workers < 0:
        raise LmdataError(f"{where}: {key('workers')} must be >= 0 (0 = all cores), got {cfg.workers}")
    if cfg.engine not in ENGINES:
        raise LmdataError(f"{where}: {key('engine')} must be local or ray, got {cfg.engine!r}")
    from lmdata.store.registry import available_formats

    if unknown := [f for f in cfg.formats if f not in available_formats()]:
        raise LmdataError(f"{where}: {key('formats')} {unknown[0]!r}: no such format; valid formats: "
                          f"{', '.join(available_formats())}")
    if cfg.engine == "local" and cfg.workers > MAX_LOCAL_WORKERS:  # past it: the OS's thread limit, mid-start
        raise LmdataError(f"{where}: {key('workers')} {cfg.workers}: at most {MAX_LOCAL_WORKERS:,} encoders on one "
                          f"machine ({os.cpu_count()} cores here; 0 = all cores)")
    if cfg.errors not in ERRORS:
        raise LmdataError(f"{where}: {key('errors')} must be one of {', '.join(ERRORS)}, got {cfg.errors!r}")
    for name, split in cfg.splits.items():
        check_split_name(name, f"{where}: splits.{name}")
        if split.kind not in KINDS:
            raise LmdataError(f"{where}: splits.{name}.kind {split.kind!r} is not one of {', '.join(KINDS)}")
        if not split.sources:
            raise LmdataError(f"{where}: splits.{name}.sources is empty; list the input files")
    h = cfg.holdout
    if h is not None:
        check_split_name(h.to, f"{where}: holdout.to")
        if h.documents < 1:
            raise LmdataError(f"{where}: holdout.documents must be positive, got {h.documents}")
        if h.from_split not in cfg.splits:
            raise LmdataError(f"{where}: holdout.from {h.from_split!r} is not a split ({', '.join(cfg.splits)})")
        if h.to in cfg.splits:
            raise LmdataError(f"{where}: holdout.to {h.to!r} is already a split with its own sources")


def load_pipeline(path: str | Path) -> PipelineConfig:
    """Read and check a pipeline TOML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LmdataError(f"pipeline {path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise LmdataError(f"pipeline {path}: not UTF-8 text (byte {exc.start}); a pipeline is a TOML file, "
                          "saved as UTF-8") from None
    except OSError as exc:
        raise LmdataError(f"pipeline {path}: cannot be read ({exc.strerror})") from None
    try:
        obj = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LmdataError(f"pipeline {path}: invalid TOML ({exc})") from None
    return parse_pipeline(obj, str(path))


def load_train_config(pipeline_path: str | Path) -> TrainConfig:
    """The ``[train]`` section of a pipeline file; ``store`` defaults to ``[ingest].out``."""
    pipe = load_pipeline(pipeline_path)
    defaults = {"store": pipe.ingest.out} if pipe.ingest is not None and pipe.ingest.out else {}
    return pipe.section(TrainConfig, "train", **defaults)


def load_bench_config(pipe: PipelineConfig) -> BenchConfig:
    """``[bench]``; ``store`` defaults to ``[ingest].out`` and ``out`` to ``<store>-bench``."""
    store = pipe.ingest.out if pipe.ingest is not None else ""
    bench = pipe.section(BenchConfig, "bench", **({"store": store} if store else {}))
    if not bench.out and bench.store:  # a store at s3://bucket/x benches into the local x-bench
        store = str(bench.store).rstrip("/")
        bench.out = f"{store.rsplit('/', 1)[-1] if '://' in store else store}-bench"
    return bench

