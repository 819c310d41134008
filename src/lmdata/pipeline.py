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

Every section is parsed by ``lmdata.config`` (through ``load_sections``); the command is
``lmdata.cli.run``. Example: ``pipelines/sample.toml``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from lmdata.io import atomic
from lmdata.config import (
    BenchConfig,
    IngestConfig,
    PipelineConfig,
    SampleConfig,
    SplitConfig,
    TokenizerConfig,
    TrainConfig,
    flag,
    load_bench_config,
    load_pipeline,
    load_train_config,
)
from lmdata.errors import LmdataError
from lmdata.io.location import Location, location


def load_sections(path: str | Path) -> tuple[PipelineConfig, TrainConfig, BenchConfig, SampleConfig]:
    """Every section of a pipeline file, checked: (pipeline, train, bench, sample)."""
    pipe = load_pipeline(path)
    if pipe.ingest is None or pipe.tokenizer is None:
        raise LmdataError(f"pipeline {path}: `lmdata run` needs [tokenizer] and [ingest] sections")
    if not pipe.ingest.out:  # (it had been "--store: no store given", a flag `run` does not have)
        raise LmdataError(f"pipeline {path}: [ingest] has no out; set out = \"STORE\" (the store to write)")
    return pipe, load_train_config(path), load_bench_config(pipe), pipe.section(SampleConfig, "sample")


BENCH_FILES = ("bench.json", "table.txt", "stall.png", "waits.png")


@dataclass
class RunResult:
    """Where a run's artifacts are, and which steps it reused instead of redoing."""

    store: Location  # local or s3://
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


# ---------------------------------------------------------------------------- errors in the file's terms


def toml_keys(section: str, *classes: type) -> dict[str, str]:
    """Each command-line flag of ``classes``' fields -> ``[section] key``, the name the pipeline file gives it."""
    return {f"--{flag(f.name, cls)}": f"[{section}] {f.metadata.get('toml', f.name)}"
            for cls in classes for f in dataclasses.fields(cls)}


INGEST_KEYS = {**{k: v for k, v in toml_keys("ingest", IngestConfig).items() if k != "--splits"},
               **{k: v for k, v in toml_keys("ingest.splits.NAME", SplitConfig).items() if k != "--sources"},
               "--input": "[ingest.splits.NAME] sources", "--holdout": "[ingest.holdout]"}
TRAIN_KEYS, BENCH_KEYS, SAMPLE_KEYS = (toml_keys("train", TrainConfig), toml_keys("bench", BenchConfig),
                                     toml_keys("sample", SampleConfig))
TOKENIZER_KEYS = {"--out": "[tokenizer] dir", "--input": "[tokenizer] train_files",
                  "--vocab-size": "[tokenizer] vocab_size", "--special-token": "[tokenizer] special_tokens"}
_VALUE_KEYS = {"--holdout": "[ingest.holdout] documents"}  # "--holdout N": N is this key's


@contextmanager
def in_toml_terms(path: str | Path, keys: dict[str, str]) -> Iterator[None]:
    """A step's error that names its settings by their flags (``--holdout 50: ...``, raised deep in the
    library the command shares) re-raised naming the pipeline file and its keys instead
    (``p.toml: [ingest.holdout] documents = 50: ...``): the user of ``lmdata run`` wrote no flag. A
    command quoted in backticks (advice to run another command) keeps its flags."""
    try:
        yield
    except LmdataError as exc:
        text = str(exc)
        flags = "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))
        lead = re.match(rf"({flags}) ([^\s:`]+):", text)
        if lead:  # "--flag VALUE: why" -> "[section] key = VALUE: why"
            key = _VALUE_KEYS.get(lead.group(1), keys[lead.group(1)])
            text = f"{key} = {lead.group(2)}:{text[lead.end():]}"
        parts = text.split("`")  # the odd parts are quoted
        renamed = "`".join(part if i % 2 else re.sub(rf"(?<![\w./-])({flags})(?![\w/-])",
                                                     lambda m: keys[m.group(1)], part)
                           for i, part in enumerate(parts))
        if renamed == str(exc):
            raise
        raise type(exc)(f"{path}: {renamed}") from None


# ---------------------------------------------------------------------------- the steps


def ensure_tokenizer(cfg: TokenizerConfig, *, progress: bool, log: Callable[[str], None],
                     ingest: IngestConfig | None = None) -> Path:
    """The pipeline's tokenizer directory, trained first (as `lmdata tokenizer train`) when missing."""
    from lmdata.tokenizer.saved import check_replaceable, is_lmdata_tokenizer_dir

    d = Path(cfg.dir)
    if is_lmdata_tokenizer_dir(d) or (not cfg.train_files and d.is_dir()):
        log(f"tokenizer: reusing {d}")
        return d
    check_replaceable(d, "[tokenizer] dir")  # a Hugging Face or other folder is never trained over
    if not cfg.train_files:
        raise LmdataError(f"[tokenizer] dir {d} holds no tokenizer and train_files is empty; set one of them")
    from lmdata.tokenizer import Tokenizer
    from lmdata.tokenizer.train import train_bpe_stats

    # files, s3:// objects and globs of either, as ingest takes them; a JSONL/Parquet/Arrow file is read
    # as its documents, with the splits' kind where the files are the splits' own and the kinds agree
    # (else by extension: a .txt beside a jsonl split is text), and their text field where they agree
    splits = list(ingest.splits.values()) if ingest is not None else []
    own = set(cfg.train_files) <= {src for s in splits for src in s.sources}
    kinds, fields = ({s.kind for s in splits} if own else {"auto"}), {s.text_field for s in splits}
    vocab, merges, stats = train_bpe_stats(list(cfg.train_files), cfg.vocab_size, cfg.special_tokens,
                                           progress=progress, kind=kinds.pop() if len(kinds) == 1 else "auto",
                                           text_field=fields.pop() if len(fields) == 1 else "text",
                                           errors=ingest.errors if ingest is not None else "strict")
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
    from lmdata.ingest.output import PLAN_NAME, store_layout
    from lmdata.sources import SourceSpec
    from lmdata.store.layout import MANIFEST_NAME

    cfg = pipe.ingest
    if location(cfg.out, flag="[ingest] out").remote:  # s3://: the same decisions from the prefix's objects
        from lmdata.ingest.publish import remote_state

        out, (done, resume) = cfg.out, remote_state(cfg.out)
        resume = resume and not overwrite
    else:
        out = location(cfg.out).local_path
        done = (out / MANIFEST_NAME).is_file() and store_layout(out) is not None
        resume = (out / PLAN_NAME).is_file() and not overwrite
    if done and not overwrite:
        log(f"ingest: reusing {out} (delete it or pass --fresh to redo it)")
        return True
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


def ensure_trained(cfg: Any, *, log: Callable[[str], None]) -> tuple[Path, bool]:
    """Train to the target step (resuming a partial run); returns (final checkpoint, reused)."""
    from lmdata.store import open_store
    from lmdata.train.checkpoint import (
        CHECKPOINT_DIR,
        latest_checkpoint,
        read_checkpoint,
        step_of,
    )
    from lmdata.train.loop import train

    ckpt_dir = Path(cfg.out) / CHECKPOINT_DIR
    latest = latest_checkpoint(ckpt_dir)
    steps = target_steps(cfg)
    if latest is not None and step_of(latest) >= steps:
        meta = read_checkpoint(latest).get("meta", {})
        if meta.get("tokenizer_hash") != open_store(cfg.store or cfg.mix[0]["store"]).manifest.tokenizer_hash:
            raise LmdataError(f"checkpoint {latest} was trained on another store than {cfg.store}; "
                              "pass --fresh to retrain, or set another out in [train]")
        log(f"train: reusing {latest} (step {step_of(latest)} >= {steps}; --fresh retrains from step 0)")
        return latest, True
    if latest is not None:
        log(f"train: resuming {latest} (step {step_of(latest)} of {steps})")
    try:
        result = train(dataclasses.replace(cfg, resume=latest is not None), log=log)
    except LmdataError as exc:
        if latest is None:
            raise
        raise LmdataError(f"{exc} (`lmdata run --fresh` starts the whole job over)") from None
    final = result.checkpoint or latest_checkpoint(ckpt_dir)
    assert final is not None, "train() always checkpoints its last step"
    return final, False


def write_sample(ckpt: Path, cfg: SampleConfig, out: Path, device: str, log: Callable[[str], None]) -> Path:
    """Generate a text from ``ckpt`` (as `lmdata sample`), print it and keep it in ``out``."""
    from lmdata.train.sample import sample

    text = cfg.prompt + sample(ckpt, cfg.prompt, max_tokens=cfg.max_tokens, temperature=cfg.temperature,
                               top_p=cfg.top_p, seed=cfg.seed, device=device)
    atomic.write_text(out, text + "\n")
    log(f"sample ({ckpt.name}, temperature {cfg.temperature}):\n{text}\n")
    return out


def ensure_bench(cfg: BenchConfig, *, log: Callable[[str], None]) -> tuple[Path, bool]:
    """Run `lmdata bench` over every format unless ``<out>/bench.json`` exists; (its path, reused)."""
    out = Path(cfg.out)
    report_json = out / BENCH_FILES[0]
    if report_json.is_file():
        log(f"bench: reusing {report_json}")
        return report_json, True
    from lmdata.bench import report
    from lmdata.bench.run import run_bench

    report.check_out(out, "[bench] out")
    result = run_bench(cfg, progress=log)
    log("\n".join([*report.header_lines(result), report.table(result), *report.notes(result)]))
    report.write_all(result, out)  # bench.json last: its presence means the bench finished
    return report_json, False


def clear_outputs(pipe: PipelineConfig, train_cfg: Any, bench: BenchConfig, log: Callable[[str], None]) -> None:
    """``--fresh``: delete what these steps wrote (the store is replaced by the ingest itself).

    Every directory is checked first, and nothing is deleted unless all of them are lmdata's
    own output holding only lmdata's files: a Hugging Face folder named as ``[tokenizer] dir``,
    or a ``[train] out`` with a user's files, is refused with the names of those files.
    """
    from lmdata.bench.report import OUT_FILES, check_out
    from lmdata.tokenizer.saved import FILES, check_replaceable, is_lmdata_tokenizer_dir
    from lmdata.train.checkpoint import CHECKPOINT_DIR, check_run_dir

    tok = Path(pipe.tokenizer.dir)
    retrain = bool(pipe.tokenizer.train_files) and tok.is_dir()
    if retrain:
        check_replaceable(tok, "[tokenizer] dir")
    train_out, bench_out = Path(train_cfg.out), Path(bench.out)
    check_run_dir(train_out, "[train] out")
    check_out(bench_out, "[bench] out")
    if retrain and is_lmdata_tokenizer_dir(tok):
        for name in FILES:
            (tok / name).unlink(missing_ok=True)
        if not any(tok.iterdir()):
            tok.rmdir()
    for name in (CHECKPOINT_DIR, "tensorboard", "wandb"):  # the last two: --log tensorboard,wandb
        shutil.rmtree(train_out / name, ignore_errors=True)
    for path in [train_out / n for n in ("metrics.jsonl", "loss.png", "sample.txt")] + \
                [bench_out / n for n in OUT_FILES]:
        path.unlink(missing_ok=True)
    log("fresh: removed the tokenizer (if trained here), checkpoints, metrics, trackers' files, sample and bench report")


def _checked_sections(path: str | Path, steps: int | None, progress: bool,
                      skip_bench: bool) -> tuple[PipelineConfig, Any, BenchConfig, SampleConfig]:
    """The file's sections, ``steps`` (``lmdata run --steps``) applied, train's and bench's values checked
    before any step: a bench that cannot run is said before the hours of training, not after them."""
    pipe, train_cfg, bench_cfg, sample_cfg = load_sections(path)
    if steps is not None:
        if steps < 1:
            raise LmdataError(f"--steps must be >= 1, got {steps}")
        train_cfg = dataclasses.replace(train_cfg, steps=steps, tokens=0)
    train_cfg = dataclasses.replace(train_cfg, progress=progress)
    with in_toml_terms(path, TRAIN_KEYS):
        train_cfg.check()
    if not skip_bench:
        with in_toml_terms(path, BENCH_KEYS):
            dataclasses.replace(bench_cfg).check()
    return pipe, train_cfg, bench_cfg, sample_cfg


def run_pipeline(path: str | Path, *, steps: int | None = None, skip_bench: bool = False, fresh: bool = False,
                 progress: bool = True, log: Callable[[str], None] | None = print) -> RunResult:
    """The main job of ``path`` (see the module docstring); ``steps`` overrides ``[train] steps``."""
    from lmdata.store.verify import verify_store
    from lmdata.tokenizer.saved import is_lmdata_tokenizer_dir
    from lmdata.train.device import resolve_device

    log = log or (lambda msg: None)
    start = time.perf_counter()
    world = os.environ.get("WORLD_SIZE", "1")
    if world.strip() not in ("", "1"):  # each rank would tokenize, ingest, sample and bench again
        raise LmdataError(
            f"lmdata run {path}: under torchrun (WORLD_SIZE={world}) every process would run the whole pipeline; "
            f"build the store once (`lmdata run {path}` without torchrun, or `lmdata ingest {path}`), "
            f"then `torchrun ... -m lmdata train {path}`")
    pipe, train_cfg, bench_cfg, sample_cfg = _checked_sections(path, steps, progress, skip_bench)
    reused: list[str] = []
    if fresh:
        clear_outputs(pipe, train_cfg, bench_cfg, log)

    log(f"== 1/6 tokenizer ({pipe.tokenizer.dir})")
    tok_reused = is_lmdata_tokenizer_dir(Path(pipe.tokenizer.dir))
    with in_toml_terms(path, TOKENIZER_KEYS):
        tok_dir = ensure_tokenizer(pipe.tokenizer, progress=progress, log=log, ingest=pipe.ingest)
    reused += ["tokenizer"] if tok_reused else []
    log(f"== 2/6 ingest -> {pipe.ingest.out}")
    with in_toml_terms(path, INGEST_KEYS):
        if ensure_store(pipe, tok_dir, overwrite=fresh, progress=progress, log=log):
            reused.append("store")
    log(f"== 3/6 verify {pipe.ingest.out}")
    report = verify_store(pipe.ingest.out)
    report.raise_if_bad()
    log(f"verify: ok ({report.files:,} files, {report.bytes:,} bytes; every format holds the same tokens)")
    log(f"== 4/6 train {train_cfg.model} for {target_steps(train_cfg)} steps -> {train_cfg.out}")
    with in_toml_terms(path, TRAIN_KEYS):
        ckpt, was_reused = ensure_trained(train_cfg, log=log)
    reused += ["checkpoint"] if was_reused else []
    log("== 5/6 sample")
    device = str(resolve_device(train_cfg.device))
    with in_toml_terms(path, SAMPLE_KEYS):
        sample_path = write_sample(ckpt, sample_cfg, Path(train_cfg.out) / "sample.txt", device, log)
    bench_path = None
    if skip_bench:
        log("== 6/6 bench: skipped (--skip-bench)")
    else:
        log(f"== 6/6 bench every format -> {bench_cfg.out}")
        with in_toml_terms(path, BENCH_KEYS):
            bench_path, was_reused = ensure_bench(bench_cfg, log=log)
        reused += ["bench"] if was_reused else []
    out = Path(train_cfg.out)
    store = location(pipe.ingest.out)
    return RunResult(store=store, checkpoint=ckpt, metrics=out / "metrics.jsonl",
                     loss_png=out / "loss.png", sample=sample_path, bench=bench_path, reused=reused,
                     seconds=time.perf_counter() - start)
