"""CLI commands of the ingest side: ``ingest``, ``inspect``, ``sql``, ``show``, ``verify``.

Each parses its flags and calls one library function (``lmdata.ingest.ingest``,
``lmdata.inspect.*``, ``lmdata.store.verify.verify_store``), so everything here is also
callable from Python with the same arguments.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

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


def _formats_arg(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise LmdataError("--format is empty; pass e.g. --format memmap,parquet,lance")
    return names


def _tokenizer_from_config(cfg: object) -> Path:
    """The pipeline's tokenizer directory, trained first if it does not exist yet."""
    d = Path(cfg.dir)  # type: ignore[attr-defined]
    if (d / "tokenizer.json").is_file():
        return d
    if not cfg.train_files:  # type: ignore[attr-defined]
        raise LmdataError(f"[tokenizer] dir {d} holds no tokenizer and train_files is empty; set one of them")
    from lmdata.sources import expand
    from lmdata.tokenizer import Tokenizer, train_bpe

    files = [str(f) for f in expand(cfg.train_files)]  # type: ignore[attr-defined]
    vocab, merges = train_bpe(files, cfg.vocab_size, cfg.special_tokens)  # type: ignore[attr-defined]
    Tokenizer(vocab, merges, cfg.special_tokens).save(d)  # type: ignore[attr-defined]
    click.echo(f"trained tokenizer ({len(vocab):,} ids) -> {d}", err=True)
    return d


@click.command("ingest")
@click.argument("pipeline", required=False, type=click.Path(dir_okay=False))
@click.option("--input", "inputs", multiple=True, help="Input file or glob (repeatable): the split `train`.")
@click.option("--split", "split_args", multiple=True, metavar="NAME=PATH", help="Input of split NAME (repeatable).")
@click.option("--tokenizer", "tokenizer_dir", help="Saved tokenizer directory.")
@click.option("--out", help="Store directory to write.")
@click.option("--format", "formats", help="Comma-separated formats (default: memmap,parquet,lance).")
@click.option("--shard-tokens", type=int, help="Tokens per shard (default 1,048,576).")
@click.option("--workers", type=int, help="Tokenizer processes (default: all cores).")
@click.option("--kind", help="How inputs are cut into documents: auto|text|lines|jsonl|parquet.")
@click.option("--separator", help="Document separator line for kind=text (default <|endoftext|>).")
@click.option("--text-field", help="JSONL field / Parquet column with the text (default: text).")
@click.option("--errors", type=click.Choice(["strict", "replace"]), help="Invalid UTF-8: fail (default) or replace and count.")
@click.option("--holdout", type=int, help="Move the last N documents of `train` into split `validation`.")
@click.option("--resume", is_flag=True, help="Continue an interrupted ingest from its completed shards.")
@click.option("--overwrite", is_flag=True, help="Replace an existing store (or an interrupted one).")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--engine", type=click.Choice(["local", "ray"]),
              help="Where to tokenize and write: this machine's cores (default), or a Ray cluster (same store).")
@click.option("--ray-address", help="Ray cluster to join with --engine ray (default: start a local Ray).")
def ingest_command(pipeline: str | None, inputs: tuple[str, ...], split_args: tuple[str, ...], tokenizer_dir: str | None,
                   out: str | None, formats: str | None, shard_tokens: int | None, workers: int | None,
                   kind: str | None, separator: str | None, text_field: str | None, errors: str | None,
                   holdout: int | None, resume: bool, overwrite: bool, no_progress: bool, engine: str | None,
                   ray_address: str | None) -> None:
    """Tokenize raw text into a store (memmap, Parquet, Lance): a PIPELINE.toml, or flags."""
    from lmdata.config import IngestConfig, SplitConfig, check_ingest, load_pipeline
    from lmdata.ingest import ingest
    from lmdata.sources import SourceSpec

    cfg = IngestConfig()
    tok = Path(tokenizer_dir) if tokenizer_dir else None
    if pipeline:
        pc = load_pipeline(pipeline)
        if pc.ingest is None:
            raise LmdataError(f"pipeline {pipeline}: no [ingest] section")
        cfg = pc.ingest
        if tok is None and pc.tokenizer is not None:
            tok = _tokenizer_from_config(pc.tokenizer)
    cli_splits = _split_arg(split_args)
    if inputs:
        cli_splits.setdefault("train", []).extend(inputs)
    if cli_splits:  # flags replace the pipeline's splits
        cfg.splits = {n: SplitConfig(sources=p) for n, p in cli_splits.items()}
        cfg.holdout = None
    for split in cfg.splits.values():
        split.kind = kind or split.kind
        split.separator = separator or split.separator
        split.text_field = text_field or split.text_field
    cfg.out = out or cfg.out
    cfg.formats = _formats_arg(formats) or cfg.formats
    cfg.shard_tokens = shard_tokens if shard_tokens is not None else cfg.shard_tokens
    cfg.workers = workers if workers is not None else cfg.workers
    cfg.errors = errors or cfg.errors
    cfg.engine, cfg.ray_address = engine or cfg.engine, ray_address or cfg.ray_address
    if not cfg.splits:
        raise LmdataError("no input given; pass --input PATH, --split NAME=PATH or a PIPELINE.toml")
    if tok is None:
        raise LmdataError("no tokenizer given; pass --tokenizer DIR (or a [tokenizer] section in the pipeline)")
    if not cfg.out:
        raise LmdataError("no output given; pass --out STORE")
    check_ingest(cfg, "ingest")
    hold = (cfg.holdout.from_split, cfg.holdout.to, cfg.holdout.documents) if cfg.holdout else None
    if holdout is not None:
        hold = ("train", "validation", holdout)
    specs = {
        name: SourceSpec(tuple(s.sources), s.kind, s.separator, s.text_field, cfg.errors)
        for name, s in cfg.splits.items()
    }
    ingest(specs, tok, cfg.out, formats=cfg.formats or None, shard_tokens=cfg.shard_tokens, workers=cfg.workers,
           resume=resume, overwrite=overwrite, holdout=hold, progress=not no_progress, log=click.echo,
           engine=cfg.engine, ray_address=cfg.ray_address or None)


@click.command("inspect")
@click.argument("store", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
def inspect_command(store: str, as_json: bool) -> None:
    """Per split and format: documents, tokens, shards, bytes, document lengths, tokenizer."""
    from lmdata.inspect import format_inspect, inspect

    report = inspect(store)
    click.echo(json.dumps(report, indent=1) if as_json else format_inspect(report))


@click.command("show")
@click.argument("store", type=click.Path())
@click.option("--split", default="train", show_default=True)
@click.option("--doc", type=int, required=True, help="Document id within the split.")
@click.option("--format", "fmt", help="Read from this format (default: the store's fastest).")
def show_command(store: str, split: str, doc: int, fmt: str | None) -> None:
    """Decode one document of a store back to text."""
    from lmdata.inspect import show

    click.echo(show(store, split, doc, fmt))


@click.command("verify")
@click.argument("store", type=click.Path())
def verify_command(store: str) -> None:
    """Checksums, counts against the manifest, identical token streams across formats."""
    from lmdata.store.verify import verify_store

    report = verify_store(store)
    report.raise_if_bad()  # exit 1 naming the first bad shard
    click.echo(f"{store}: ok ({report.files:,} files, {report.bytes:,} bytes checked; every format holds the same tokens)")
