"""Pipeline TOML -> dataclasses: every shipped pipeline parses; mistakes name the key."""

from __future__ import annotations

import json
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package
    import tomli as tomllib
from pathlib import Path

import pytest

from lmdata.config import IngestConfig, TokenizerConfig, help_text, load_pipeline, parse_pipeline
from lmdata.errors import LmdataError

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((REPO / "pipelines").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_pipeline_parses(path):
    cfg = load_pipeline(path)
    assert cfg.ingest is not None and cfg.ingest.splits and cfg.ingest.out
    assert cfg.tokenizer is not None and cfg.tokenizer.dir


def test_sample_pipeline_holds_out_validation():
    cfg = load_pipeline(REPO / "pipelines" / "sample.toml")
    assert cfg.ingest.splits["train"].sources == ["data/sample.txt"]
    h = cfg.ingest.holdout
    assert (h.from_split, h.to, h.documents) == ("train", "validation", 6)


def test_every_field_has_help():
    for cls in (IngestConfig, TokenizerConfig):
        assert all(help_text(cls).values()), cls


BASE = """
[tokenizer]
dir = "tok"
[ingest]
out = "store"
[ingest.splits.train]
sources = ["a.txt"]
"""


def test_unknown_sections_pass_through_unknown_keys_fail():
    cfg = parse_pipeline(tomllib.loads(BASE + '[train]\nsteps = 5\n[bench]\nx = "y"\n'))
    assert cfg.sections == {"train": {"steps": 5}, "bench": {"x": "y"}}
    with pytest.raises(LmdataError, match=r"\[ingest\]: unknown key 'shard_size'"):
        parse_pipeline(tomllib.loads(BASE.replace('out = "store"', 'out = "store"\nshard_size = 5')))
    with pytest.raises(LmdataError, match=r"\[ingest.splits.train\]: unknown key 'path'"):
        parse_pipeline(tomllib.loads(BASE + 'path = "x"\n'))
    with pytest.raises(LmdataError, match=r"\[tokenizer\]: unknown key 'vocab'"):
        parse_pipeline(tomllib.loads(BASE.replace('dir = "tok"', 'dir = "tok"\nvocab = 5')))


@pytest.mark.parametrize(
    "extra, message",
    [
        ("shard_tokens = 0", "shard_tokens must be positive"),
        ('shard_tokens = "big"', r"shard_tokens: expected int"),
        ('errors = "ignore"', "errors must be one of"),
        ("workers = -1", "workers must be >= 0"),
    ],
)
def test_bad_values_are_named(extra, message):
    with pytest.raises(LmdataError, match=message):
        parse_pipeline(tomllib.loads(BASE.replace('out = "store"', f'out = "store"\n{extra}')))


def test_holdout_checks():
    ok = parse_pipeline(tomllib.loads(BASE + '[ingest.holdout]\nfrom = "train"\nto = "val"\ndocuments = 3\n'))
    assert ok.ingest.holdout.to == "val"
    with pytest.raises(LmdataError, match="holdout.from 'dev' is not a split"):
        parse_pipeline(tomllib.loads(BASE + '[ingest.holdout]\nfrom = "dev"\ndocuments = 3\n'))
    with pytest.raises(LmdataError, match="unknown key 'from_split'"):
        parse_pipeline(tomllib.loads(BASE + '[ingest.holdout]\nfrom_split = "train"\ndocuments = 3\n'))


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(LmdataError, match="no such file"):
        load_pipeline(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[ingest\n")
    with pytest.raises(LmdataError, match="invalid TOML"):
        load_pipeline(tmp_path / "bad.toml")


@pytest.mark.parametrize("name", ["../x", "/abs/path", "a/b", "..", ".hidden", "tokenizer", "x..y"])
def test_split_names_must_stay_inside_the_store(name):
    bad_split = BASE.replace("[ingest.splits.train]", f"[ingest.splits.{json.dumps(name)}]")
    with pytest.raises(LmdataError, match=r"\[ingest\]: splits\..*: split name .* must be a letter or digit") as err:
        parse_pipeline(tomllib.loads(bad_split))
    assert "\n" not in str(err.value)
    bad_holdout = BASE + f"[ingest.holdout]\nto = {json.dumps(name)}\ndocuments = 3\n"
    with pytest.raises(LmdataError, match=r"\[ingest\]: holdout.to: split name .* must be a letter or digit"):
        parse_pipeline(tomllib.loads(bad_holdout))
