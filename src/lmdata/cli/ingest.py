"""``lmdata ingest [PIPELINE.toml] [--flags]``: a thin click shell over ``lmdata.ingest.ingest``.

The ``[ingest]`` keys (``IngestConfig``) and the per-split keys (``SplitConfig``: kind,
separator, text_field; they apply to every split) are flags; flags override the file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from lmdata.cli.options import config_options, echo_unless, given, progress_options, untyped
from lmdata.config import IngestConfig, SplitConfig, TokenizerConfig, check_ingest, load_pipeline
from lmdata.errors import LmdataError


def _split_arg(values: tuple[str, ...]) -> dict[str, list[str]]:
    from lmdata.store.manifest import check_split_name  # here: it imports numpy

    splits: dict[str, list[str]] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise LmdataError(f"--split {value!r}: expected NAME=PATH (or NAME=GLOB)")
        check_split_name(name, f"--split {value!r}")
        splits.setdefault(name, []).append(path)
    return splits


def _tokenizer_from_config(cfg: TokenizerConfig, progress: bool, quiet: bool, ingest: Any = None) -> Path:
    """The pipeline's tokenizer directory, trained first if it does not exist yet (as ``lmdata run`` does)."""
    from lmdata.pipeline import ensure_tokenizer

    return ensure_tokenizer(cfg, progress=progress, log=echo_unless(quiet, err=True), ingest=ingest)


@click.command("ingest")
@click.argument("pipeline", required=False, type=click.Path(dir_okay=False))
@click.option("--input", "inputs", multiple=True, help="Input file or glob (repeatable): the split `train`.")
@click.option("--split", "split_args", multiple=True, metavar="NAME=PATH", help="Input of split NAME (repeatable).")
@click.option("--tokenizer", "tokenizer_dir", help="Saved tokenizer directory.")
@config_options(IngestConfig, skip=("splits", "holdout"))
@config_options(SplitConfig, skip=("sources",))
@click.option("--holdout", type=int, help="Move the last N documents of `train` into split `validation`.")
@click.option("--resume", is_flag=True, help="Continue an interrupted ingest from its completed shards.")
@click.option("--overwrite", is_flag=True, help="Replace an existing store (or an interrupted one).")
@progress_options
@click.pass_context
def ingest_command(ctx: click.Context, pipeline: str | None, inputs: tuple[str, ...], split_args: tuple[str, ...],
                   tokenizer_dir: str | None, holdout: int | None, resume: bool, overwrite: bool, progress: bool,
                   quiet: bool, **flags) -> None:
    """Tokenize raw text into a store (memmap, Parquet, Lance): a PIPELINE.toml, or flags."""
    progress = progress and not quiet
    cfg = IngestConfig()
    tok = Path(tokenizer_dir) if tokenizer_dir else None
    if pipeline:
        pc = load_pipeline(pipeline)
        if pc.ingest is None:
            raise LmdataError(f"pipeline {pipeline}: no [ingest] section")
        cfg = pc.ingest
        if tok is None and pc.tokenizer is not None:
            tok = _tokenizer_from_config(pc.tokenizer, progress=progress, quiet=quiet, ingest=pc.ingest)
    cli_splits = _split_arg(split_args)
    if inputs:
        cli_splits.setdefault("train", []).extend(inputs)
    if cli_splits:  # flags replace the pipeline's splits
        cfg.splits = {n: SplitConfig(sources=p) for n, p in cli_splits.items()}
        cfg.holdout = None
    per_split = given(ctx, SplitConfig, flags)
    cfg.splits = {n: dataclasses.replace(s, **per_split) for n, s in cfg.splits.items()}
    cfg = dataclasses.replace(cfg, **given(ctx, IngestConfig, flags))
    if not cfg.splits:
        raise LmdataError("no input given; pass --input PATH, --split NAME=PATH or a PIPELINE.toml")
    if tok is None:
        raise LmdataError("no tokenizer given; pass --tokenizer DIR (or a [tokenizer] section in the pipeline)")
    if not cfg.out:
        raise LmdataError("no output given; pass --out STORE")
    if pipeline:  # errors name the file's keys for what the file gave, flags for what was typed
        from lmdata.pipeline import INGEST_KEYS, in_toml_terms

        with in_toml_terms(pipeline, untyped(ctx, INGEST_KEYS)):
            _run(cfg, tok, holdout, resume, overwrite, progress)
    else:
        _run(cfg, tok, holdout, resume, overwrite, progress)


def _run(cfg: IngestConfig, tok: Path, holdout: int | None, resume: bool, overwrite: bool, progress: bool) -> None:
    """The ingest the command's arguments and pipeline file add up to."""
    from lmdata.ingest import ingest
    from lmdata.sources import SourceSpec

    check_ingest(cfg, "ingest")
    hold = (cfg.holdout.from_split, cfg.holdout.to, cfg.holdout.documents) if cfg.holdout else None
    if holdout is not None:
        hold = ("train", "validation", holdout)
    specs = {
        name: SourceSpec(tuple(s.sources), s.kind, s.separator, s.text_field, cfg.errors)
        for name, s in cfg.splits.items()
    }
    from lmdata.cli import resume_hint_only_if

    with resume_hint_only_if(lambda: "://" in str(cfg.out) or Path(cfg.out).exists()):  # the store written to
        ingest(specs, tok, cfg.out, formats=cfg.formats or None, shard_tokens=cfg.shard_tokens, workers=cfg.workers,
               resume=resume, overwrite=overwrite, holdout=hold, progress=progress, log=click.echo,
               engine=cfg.engine, ray_address=cfg.ray_address or None)
