"""Pipeline files (``pipelines/*.toml``) -> small dataclasses, one per section.

Each field carries its help text (``field(metadata={"help": ...})``), so the file
format is documented where it is parsed. Sections this module does not own
(``[train]``, ``[bench]``, ...) are passed through untouched in ``PipelineConfig.sections``
for their owners; an unknown key *inside* ``[tokenizer]`` or ``[ingest]`` is an error
naming the key. Relative paths are relative to the directory ``lmdata`` runs in (the
repository root for the shipped pipelines). Example: ``pipelines/sample.toml``.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmdata.errors import LmdataError
from lmdata.sources import DEFAULT_SEPARATOR, ERRORS, KINDS

def _f(default: Any, help: str) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TokenizerConfig:
    dir: str = _f("", "Saved tokenizer directory; used as is if it exists, else trained into it.")
    train_files: list[str] = _f([], "Text files (or globs) to train a BPE tokenizer on when `dir` does not exist yet.")
    vocab_size: int = _f(0, "Vocabulary size when training (256 bytes + merges + special tokens).")
    special_tokens: list[str] = _f([DEFAULT_SEPARATOR], "Special tokens when training; the last is end-of-text.")


@dataclass
class SplitConfig:
    sources: list[str] = _f([], "Input files or globs, read in this order (each glob sorted).")
    kind: str = _f("auto", f"How to cut files into documents: {', '.join(KINDS)} (auto: by extension).")
    separator: str = _f(DEFAULT_SEPARATOR, "kind=text: the line that separates documents.")
    text_field: str = _f("text", "kind=jsonl/parquet: the field or column holding the document text.")


@dataclass
class HoldoutConfig:
    documents: int = _f(0, "How many documents, taken from the END of `from`'s sources, form split `to`.")
    from_split: str = _f("train", "The split the held-out documents are taken from (TOML key: `from`).")
    to: str = _f("validation", "The name of the held-out split.")


@dataclass
class IngestConfig:
    out: str = _f("", "The store directory to write.")
    formats: list[str] = _f([], "Formats to write, all from the same token stream; empty = memmap, parquet, lance.")
    shard_tokens: int = _f(1 << 20, "Tokens per shard (shards end at document boundaries; one long document may exceed it).")
    workers: int = _f(0, "Tokenizer processes; 0 = all cores. The store does not depend on it.")
    errors: str = _f("strict", f"Invalid UTF-8: {' or '.join(ERRORS)} (replace counts each U+FFFD in the summary).")
    engine: str = _f("local", "Where to tokenize and write: local (this machine) or ray (a Ray cluster, "
                     "`pip install 'lmdata[ray]'`); the store is the same.")
    ray_address: str = _f("", "engine = \"ray\": the cluster to join (auto, HOST:6379, ray://HOST:10001); "
                          "empty = start a local Ray.")
    splits: dict[str, SplitConfig] = _f({}, "[ingest.splits.NAME] tables: the documents of each split.")
    holdout: HoldoutConfig | None = _f(None, "[ingest.holdout]: move the last N documents of a split into another.")


@dataclass
class PipelineConfig:
    tokenizer: TokenizerConfig | None = None
    ingest: IngestConfig | None = None
    sections: dict[str, Any] = field(default_factory=dict)  # [train], [bench], ... for their owners
    path: str = ""


def help_text(cls: type) -> dict[str, str]:
    """{field name: help} of a config dataclass, for docs and `--help`."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def _build(cls: type, table: Any, where: str, renames: dict[str, str] | None = None) -> Any:
    """Construct ``cls`` from a TOML table: unknown keys and wrong types are errors naming them."""
    if not isinstance(table, dict):
        raise LmdataError(f"{where}: expected a table, got {type(table).__name__}")
    renames = renames or {}
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        allowed = _keys(cls, renames)
        if key not in allowed:
            raise LmdataError(f"{where}: unknown key {key!r} (known: {', '.join(allowed)})")
        name = renames.get(key, key)
        expected = type(fields[name].default) if fields[name].default is not dataclasses.MISSING else None
        if expected is None and fields[name].default_factory is not dataclasses.MISSING:
            expected = type(fields[name].default_factory())
        if expected in (int, str, list) and not (isinstance(value, expected) and not isinstance(value, bool)):
            raise LmdataError(f"{where}.{key}: expected {expected.__name__}, got {value!r}")
        kwargs[name] = value
    return cls(**kwargs)


def _keys(cls: type, renames: dict[str, str]) -> list[str]:
    inverse = {v: k for k, v in renames.items()}
    return [inverse.get(f.name, f.name) for f in dataclasses.fields(cls)]


def parse_pipeline(obj: dict[str, Any], where: str = "pipeline") -> PipelineConfig:
    """A parsed TOML document -> PipelineConfig (checked)."""
    cfg = PipelineConfig(path=where)
    for name, table in obj.items():
        if name == "tokenizer":
            cfg.tokenizer = _build(TokenizerConfig, table, f"{where}: [tokenizer]")
        elif name == "ingest":
            cfg.ingest = _parse_ingest(table, f"{where}: [ingest]")
        else:
            cfg.sections[name] = table
    return cfg


def _parse_ingest(table: Any, where: str) -> IngestConfig:
    if not isinstance(table, dict):
        raise LmdataError(f"{where}: expected a table")
    table = dict(table)
    splits = table.pop("splits", {})
    holdout = table.pop("holdout", None)
    if not isinstance(splits, dict):
        raise LmdataError(f"{where}.splits: expected [ingest.splits.NAME] tables")
    cfg: IngestConfig = _build(IngestConfig, table, where)
    cfg.splits = {name: _build(SplitConfig, t, f"{where[:-1]}.splits.{name}]") for name, t in splits.items()}
    if holdout is not None:
        cfg.holdout = _build(HoldoutConfig, holdout, f"{where[:-1]}.holdout]", renames={"from": "from_split"})
    check_ingest(cfg, where)
    return cfg


def check_ingest(cfg: IngestConfig, where: str = "ingest") -> None:
    """Values that parse but cannot work: name the key and the allowed values."""
    from lmdata.store.manifest import check_split_name  # here: it imports numpy

    if cfg.shard_tokens < 1:
        raise LmdataError(f"{where}: shard_tokens must be positive, got {cfg.shard_tokens}")
    if cfg.workers < 0:
        raise LmdataError(f"{where}: workers must be >= 0 (0 = all cores), got {cfg.workers}")
    if cfg.engine not in ("local", "ray"):
        raise LmdataError(f"{where}: engine must be local or ray, got {cfg.engine!r}")
    if cfg.errors not in ERRORS:
        raise LmdataError(f"{where}: errors must be one of {', '.join(ERRORS)}, got {cfg.errors!r}")
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
    try:
        obj = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise LmdataError(f"pipeline {path}: invalid TOML ({exc})") from None
    return parse_pipeline(obj, str(path))
