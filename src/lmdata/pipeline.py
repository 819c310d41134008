"""``lmdata run PIPELINE.toml``: the main job end to end, reusing whatever is already done.

    [tokenizer] train it (if its directory holds none)
      -> [ingest] every format (if the store has no manifest; an interrupted ingest resumes)
      -> verify the store (checksums, counts, identical streams across formats)
      -> [train] the model (if the run's final checkpoint is missing; a partial run resumes)
      -> [sample] a text from the final checkpoint
      -> [bench] every format (if its bench.json is missing)

Each step calls the library function its own command calls (``train_bpe_stats``,
``lmdata.ingest.ingest``, ``verify_store``, ``lmdata.train.loop.train``,
``lmdata.train.sample.sample``, ``lmdata.bench.run.run_bench``), so ``lmdata run`` is
exactly the sequence of commands a user could type. ``fresh=True`` deletes the job's own
outputs first (only files these steps write; never a tokenizer the pipeline does not train).

The ``[bench]`` and ``[sample]`` sections are parsed here (``[tokenizer]``/``[ingest]`` by
``lmdata.config``, ``[train]`` by ``lmdata.train.config``). Example: ``pipelines/sample.toml``.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import click

from lmdata.config import PipelineConfig, TokenizerConfig, load_pipeline
from lmdata.errors import LmdataError

BENCH_FILES = ("bench.json", "table.txt", "stall.png", "waits.png")
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer.json")


def _f(default: Any, help: str) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class BenchSection:
    """``[bench]``: the ``lmdata bench`` flags (keys as in ``BenchConfig``), plus ``out``."""

    out: str = _f("", "Folder for bench.json, table.txt, stall.png, waits.png (default: <store>-bench).")
    split: str = _f("train", "Split to read.")
    formats: list = _f([], "Formats to compare; empty = every format of the store.")
    workers: list = _f([0, 1, 2], "Loader worker counts to try.")
    batch_size: int = _f(32, "Sequences per step.")
    seq_len: int = _f(256, "Tokens per sequence.")
    steps: int = _f(100, "Steps per run (capped at one epoch of the split).")
    compute: str = _f("simulated", "simulated (a fixed-duration step) or model (real training steps).")
    step_ms: float = _f(-1.0, "Simulated step time in ms; -1 = derive it from model and gpu.")
    model: str = _f("small", "Model preset whose token rate the loader must keep up with.")
    gpu: str = _f("h100", "Accelerator for the keep-up rate (see `lmdata plan --help`).")
    mfu: float = _f(0.4, "Model FLOP utilization assumed on gpu.")
    cache: list = _f(["warm"], "Page-cache states to measure: warm, cold or both.")
    prefetch: int = _f(2, "Reads each worker does ahead (a read is batches_per_read batches).")
    batches_per_read: int = _f(4, "Consecutive batches read with one call (one Lance take).")
    seed: int = _f(0, "Seed of the batch order.")
    device: str = _f("auto", "auto, cpu or cuda[:N].")


@dataclass
class SampleSection:
    """``[sample]``: what ``lmdata sample`` generates from the final checkpoint."""

    prompt: str = _f("Once upon a time", "Text to continue.")
    max_tokens: int = _f(120, "Most new tokens (stops earlier at end-of-text).")
    temperature: float = _f(0.8, "Softmax temperature; 0 = greedy.")
    top_p: float = _f(0.95, "Nucleus sampling mass.")
    seed: int = _f(0, "Sampling seed.")


@dataclass
class RunResult:
    """Where a run's artifacts are, and which steps it reused instead of redoing."""

    store: Path
    checkpoint: Path
    metrics: Path
    loss_png: Path
    sample: Path
    bench: Path | None
    reused: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        """The closing lines: every artifact and the command that looks at it."""
        rows = [("store", self.store, f"lmdata inspect {self.store}"),
                ("checkpoint", self.checkpoint, f"lmdata sample {self.checkpoint}"),
                ("metrics", self.metrics, "train/validation loss per step, JSON lines"),
                ("loss curve", self.loss_png, ""),
                ("sample", self.sample, "")]
        if self.bench is not None:
            rows.append(("bench", self.bench, f"also {', '.join(BENCH_FILES[1:])} beside it"))
        lines = [f"done in {self.seconds:.0f} s" + (f" (reused: {', '.join(self.reused)})" if self.reused else "")]
        lines += [f"  {name:<11} {path}" + (f"   ({hint})" if hint else "") for name, path, hint in rows]
        return "\n".join(lines)


def section_from_table(cls: type, table: Any, where: str) -> Any:
    """A TOML table -> ``cls``; unknown keys and wrong types are errors naming the key."""
    if not isinstance(table, dict):
        raise LmdataError(f"{where}: expected a table, got {type(table).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for key, value in table.items():
        if key not in fields:
            raise LmdataError(f"{where}: unknown key {key!r} (known: {', '.join(fields)})")
        f = fields[key]
        want = type(f.default) if f.default is not dataclasses.MISSING else list
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            raise LmdataError(f"{where}.{key}: expected {want.__name__}, got {value!r}")
        values[key] = value
    return cls(**values)


def load_sections(path: str | Path) -> tuple[PipelineConfig, Any, BenchSection, SampleSection]:
    """Every section of a pipeline file, checked: (pipeline, TrainConfig, BenchSection, SampleSection)."""
    from lmdata.train.config import load_train_config

    pipe = load_pipeline(path)
    if pipe.ingest is None or pipe.tokenizer is None:
        raise LmdataError(f"pipeline {path}: `lmdata run` needs [tokenizer] and [ingest] sections")
    train_cfg = load_train_config(str(path))
    bench = section_from_table(BenchSection, pipe.sections.get("bench", {}), f"pipeline {path}: [bench]")
    sample = section_from_table(SampleSection, pipe.sections.get("sample", {}), f"pipeline {path}: [sample]")
    if not bench.out:
        bench.out = f"{pipe.ingest.out.rstrip('/')}-bench"
    return pipe, train_cfg, bench, sample


# ---------------------------------------------------------------------------- the steps


def ensure_tokenizer(cfg: TokenizerConfig, *, progress: bool, log: Callable[[str], None]) -> Path:
    """The pipeline's tokenizer directory, trained first (as `lmdata tokenizer train`) when missing."""
    d = Path(cfg.dir)
    if (d / "tokenizer.json").is_file():
        log(f"tokenizer: reusing {d}")
        return d
    if not cfg.train_files:
        raise LmdataError(f"[tokenizer] dir {d} holds no tokenizer and train_files is empty; set one of them")
    from lmdata.sources import expand
    from lmdata.tokenizer import Tokenizer
    from lmdata.tokenizer.train import train_bpe_stats

    files = [Path(p) for p in expand(cfg.train_files)]
    vocab, merges, stats = train_bpe_stats(files, cfg.vocab_size, cfg.special_tokens, progress=progress)
    tok = Tokenizer(vocab, merges, cfg.special_tokens)
    tok.save(d)
    log(f"tokenizer: wrote {d}: {tok.vocab_size:,} ids; {stats.summary()}")
    return d


def ensure_store(pipe: PipelineConfig, tokenizer_dir: Path, *, overwrite: bool = False, progress: bool,
                 log: Callable[[str], None]) -> bool:
    """Ingest per ``[ingest]`` unless the store is complete; resumes an interrupted one. True if reused.

    ``overwrite`` re-ingests (the ingest refuses to delete a directory that is not a store).
    """
    from lmdata.ingest import ingest
    from lmdata.ingest_output import PLAN_NAME
    from lmdata.sources import SourceSpec
    from lmdata.store.manifest import MANIFEST_NAME

    cfg = pipe.ingest
    out = Path(cfg.out)
    if (out / MANIFEST_NAME).is_file() and not overwrite:
        log(f"ingest: reusing {out} (delete it or pass --fresh to redo it)")
        return True
    resume = (out / PLAN_NAME).is_file() and not overwrite
    if resume:
        log(f"ingest: {out} holds an interrupted ingest; resuming it")
    specs = {name: SourceSpec(tuple(s.sources), s.kind, s.separator, s.text_field, cfg.errors)
             for name, s in cfg.splits.items()}
    hold = (cfg.holdout.from_split, cfg.holdout.to, cfg.holdout.documents) if cfg.holdout else None
    engine, address = getattr(cfg, "engine", "local"), getattr(cfg, "ray_address", "") or None
    ingest(specs, tokenizer_dir, out, formats=cfg.formats or None, shard_tokens=cfg.shard_tokens,
           workers=cfg.workers, resume=resume, overwrite=overwrite, holdout=hold, progress=progress, log=log,
           engine=engine, ray_address=address)
    return False


def target_steps(cfg: Any) -> int:
    """The step count ``train(cfg)`` runs to on one process (``--tokens`` wins over ``--steps``)."""
    if not cfg.tokens:
        return cfg.steps
    from lmdata.train.defaults import build_model_config, resolve

    cfg = resolve(cfg)
    seq_len = cfg.seq_len or build_model_config(cfg, 0)["context_length"]
    return math.ceil(cfg.tokens / (cfg.batch_size * cfg.grad_accum * seq_len))


def _step_of(ckpt: Path) -> int:
    return int(ckpt.stem.split("-")[1])  # ckpt-00000300.pt


def ensure_trained(cfg: Any, *, log: Callable[[str], None]) -> tuple[Path, bool]:
    """Train to the target step (resuming a partial run); returns (final checkpoint, reused)."""
    from lmdata.store import open_store
    from lmdata.train.checkpoint import latest_checkpoint, read_checkpoint
    from lmdata.train.loop import train

    ckpt_dir = Path(cfg.out) / "checkpoints"
    latest = latest_checkpoint(ckpt_dir)
    steps = target_steps(cfg)
    if latest is not None and _step_of(latest) >= steps:
        meta = read_checkpoint(latest).get("meta", {})
        if meta.get("tokenizer_hash") != open_store(cfg.store or cfg.mix[0]["store"]).manifest.tokenizer_hash:
            raise LmdataError(f"checkpoint {latest} was trained on another store than {cfg.store}; "
                              "pass --fresh to retrain, or set another out in [train]")
        log(f"train: reusing {latest} (step {_step_of(latest)} >= {steps})")
        return latest, True
    if latest is not None:
        log(f"train: resuming {latest} (step {_step_of(latest)} of {steps})")
    try:
        result = train(dataclasses.replace(cfg, resume=latest is not None), log=log)
    except LmdataError as exc:
        if latest is None:
            raise
        raise LmdataError(f"{exc} (`lmdata run --fresh` starts the whole job over)") from None
    final = result.checkpoint or latest_checkpoint(ckpt_dir)
    assert final is not None, "train() always checkpoints its last step"
    return final, False


def write_sample(ckpt: Path, cfg: SampleSection, out: Path, device: str, log: Callable[[str], None]) -> Path:
    """Generate a text from ``ckpt`` (as `lmdata sample`), print it and keep it in ``out``."""
    from lmdata.train.sample import sample

    text = cfg.prompt + sample(ckpt, cfg.prompt, max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                               top_p=cfg.top_p, seed=cfg.seed, device=device)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(out)
    log(f"sample ({ckpt.name}, temperature {cfg.temperature}):\n{text}\n")
    return out


def ensure_bench(store: Path, cfg: BenchSection, *, log: Callable[[str], None]) -> tuple[Path, bool]:
    """Run `lmdata bench` over every format unless ``<out>/bench.json`` exists; (its path, reused)."""
    out = Path(cfg.out)
    report_json = out / BENCH_FILES[0]
    if report_json.is_file():
        log(f"bench: reusing {report_json}")
        return report_json, True
    from lmdata.bench import report
    from lmdata.bench.run import BenchConfig, run_bench

    values = dataclasses.asdict(cfg)
    del values["out"]
    values["step_ms"] = None if cfg.step_ms < 0 else cfg.step_ms
    values["gpu"] = cfg.gpu or None
    result = run_bench(BenchConfig(store=store, **values), progress=log)
    log("\n".join(report.header_lines(result)) + "\n" + report.table(result))
    report.write_all(result, out)  # bench.json last: its presence means the bench finished
    return report_json, False


def clear_outputs(pipe: PipelineConfig, train_cfg: Any, bench: BenchSection, log: Callable[[str], None]) -> None:
    """``--fresh``: delete what these steps write (the store is replaced by the ingest itself)."""
    tok = Path(pipe.tokenizer.dir)
    if pipe.tokenizer.train_files and (tok / "tokenizer.json").is_file():
        for name in TOKENIZER_FILES:
            (tok / name).unlink(missing_ok=True)
        if not any(tok.iterdir()):
            tok.rmdir()
    train_out = Path(train_cfg.out)
    shutil.rmtree(train_out / "checkpoints", ignore_errors=True)
    for path in [train_out / n for n in ("metrics.jsonl", "loss.png", "sample.txt")] + \
                [Path(bench.out) / n for n in BENCH_FILES]:
        path.unlink(missing_ok=True)
    log("fresh: removed the tokenizer (if trained here), checkpoints, metrics, sample and bench report")


def run_pipeline(path: str | Path, *, steps: int | None = None, skip_bench: bool = False, fresh: bool = False,
                 progress: bool = True, log: Callable[[str], None] | None = print) -> RunResult:
    """The main job of ``path`` (see the module docstring); ``steps`` overrides ``[train] steps``."""
    from lmdata.store.verify import verify_store
    from lmdata.train.loop import resolve_device

    log = log or (lambda msg: None)
    start = time.perf_counter()
    pipe, train_cfg, bench_cfg, sample_cfg = load_sections(path)
    if steps is not None:
        if steps < 1:
            raise LmdataError(f"--steps must be >= 1, got {steps}")
        train_cfg = dataclasses.replace(train_cfg, steps=steps, tokens=0)
    train_cfg = dataclasses.replace(train_cfg, progress=progress)
    train_cfg.check()
    reused: list[str] = []
    if fresh:
        clear_outputs(pipe, train_cfg, bench_cfg, log)

    log(f"== 1/6 tokenizer ({pipe.tokenizer.dir})")
    tok_reused = (Path(pipe.tokenizer.dir) / "tokenizer.json").is_file()
    tok_dir = ensure_tokenizer(pipe.tokenizer, progress=progress, log=log)
    reused += ["tokenizer"] if tok_reused else []
    log(f"== 2/6 ingest -> {pipe.ingest.out}")
    if ensure_store(pipe, tok_dir, overwrite=fresh, progress=progress, log=log):
        reused.append("store")
    log(f"== 3/6 verify {pipe.ingest.out}")
    report = verify_store(pipe.ingest.out)
    report.raise_if_bad()
    log(f"verify: ok ({report.files:,} files, {report.bytes:,} bytes; every format holds the same tokens)")
    log(f"== 4/6 train {train_cfg.model} for {target_steps(train_cfg)} steps -> {train_cfg.out}")
    ckpt, was_reused = ensure_trained(train_cfg, log=log)
    reused += ["checkpoint"] if was_reused else []
    log("== 5/6 sample")
    device = str(resolve_device(train_cfg.device))
    sample_path = write_sample(ckpt, sample_cfg, Path(train_cfg.out) / "sample.txt", device, log)
    bench_path = None
    if skip_bench:
        log("== 6/6 bench: skipped (--skip-bench)")
    else:
        log(f"== 6/6 bench every format -> {bench_cfg.out}")
        bench_path, was_reused = ensure_bench(Path(pipe.ingest.out), bench_cfg, log=log)
        reused += ["bench"] if was_reused else []
    out = Path(train_cfg.out)
    return RunResult(store=Path(pipe.ingest.out), checkpoint=ckpt, metrics=out / "metrics.jsonl",
                     loss_png=out / "loss.png", sample=sample_path, bench=bench_path, reused=reused,
                     seconds=time.perf_counter() - start)


# ---------------------------------------------------------------------------- the command

@click.command("run")
@click.argument("pipeline", type=click.Path(dir_okay=False))
@click.option("--steps", type=int, default=None, help="Train for N steps instead of [train] steps (e.g. a quick try).")
@click.option("--skip-bench", is_flag=True, help="Stop after sampling; do not run the bench.")
@click.option("--fresh", is_flag=True, help="Redo every step: delete this pipeline's tokenizer (if it trains one), "
              "checkpoints, metrics, sample and bench report, and re-ingest with --overwrite.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def run_command(pipeline: str, steps: int | None, skip_bench: bool, fresh: bool, no_progress: bool) -> None:
    """Run PIPELINE.toml end to end: tokenizer, ingest, verify, train, sample, bench.

    Each step is skipped when its output is already there (rerunning reuses what is
    done; an interrupted ingest or training run resumes), so a rerun is quick.
    """
    result = run_pipeline(pipeline, steps=steps, skip_bench=skip_bench, fresh=fresh, progress=not no_progress,
                          log=click.echo)
    click.echo(result.summary())
