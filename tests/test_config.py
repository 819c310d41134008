"""Pipeline TOML -> dataclasses: every shipped pipeline parses; mistakes name the key."""

from __future__ import annotations

import dataclasses
import json

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as the tomli package
    import tomli as tomllib
from pathlib import Path

import pytest

from lmdata.config import IngestConfig, TokenizerConfig, load_pipeline, parse_pipeline
from lmdata.errors import LmdataError

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((REPO / "pipelines").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_pipeline_parses(path):
    cfg = load_pipeline(path)
    assert cfg.ingest is not None and cfg.ingest.splits and cfg.ingest.out
    assert cfg.tokenizer is not None and cfg.tokenizer.dir


def test_sample_pipeline_holds_out_validation():
    cfg = load_pipeline(REPO / "pipelines" / "sample.toml")
    assert cfg.ingest.splits["train"].sources == [str(REPO / "data" / "sample.txt")]  # relative to pipelines/
    h = cfg.ingest.holdout
    assert (h.from_split, h.to, h.documents) == ("train", "validation", 6)


def test_pipeline_paths_are_relative_to_the_file(tmp_path, monkeypatch):
    from lmdata.pipeline import load_sections

    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "p.toml").write_text(
        '[tokenizer]\ndir = "../tok"\ntrain_files = ["in/*.txt"]\n[ingest]\nout = "s3://bucket/store"\n'
        '[ingest.splits.train]\nsources = ["/abs/a.txt", "in/b.txt"]\n'
        '[train]\nout = "../runs/t"\n[train.mix.a]\nstore = "stores/a"\nweight = 1.0\n[bench]\nout = "b"\n')
    monkeypatch.chdir(tmp_path)
    pipe, train, bench, _ = load_sections("jobs/p.toml")
    assert pipe.tokenizer.dir == "tok" and pipe.tokenizer.train_files == ["jobs/in/*.txt"]
    assert pipe.ingest.out == "s3://bucket/store" and pipe.ingest.splits["train"].sources == ["/abs/a.txt", "jobs/in/b.txt"]
    assert train.store == "s3://bucket/store" and train.out == "runs/t" and train.mix[0]["store"] == "jobs/stores/a"
    assert bench.store == "s3://bucket/store" and bench.out == "jobs/b"


def test_every_field_has_help():
    for cls in (IngestConfig, TokenizerConfig):
        assert all(f.metadata.get("help") for f in dataclasses.fields(cls)), cls


BASE = """
[tokenizer]
dir = "tok"
[ingest]
out = "store"
[ingest.splits.train]
sources = ["a.txt"]
"""


def test_the_run_sections_pass_through_unknown_keys_and_sections_fail():
    cfg = parse_pipeline(tomllib.loads(BASE + '[train]\nsteps = 5\n[bench]\nx = "y"\n'))
    assert cfg.sections == {"train": {"steps": 5}, "bench": {"x": "y"}}  # (checked by the command that reads them)
    for extra, name in (('[ingestt]\nout = "x"\n', "ingestt"), ("", "foo")):  # a typo had been ignored, silently
        text = ("foo = 1\n" if name == "foo" else "") + BASE + extra
        with pytest.raises(LmdataError, match=rf"unknown top-level entry '{name}'; the sections are \[tokenizer\], "
                                              r"\[ingest\], \[train\], \[bench\], \[sample\]"):
            parse_pipeline(tomllib.loads(text))
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


def test_run_names_a_missing_ingest_out(tmp_path):
    """It had said "--store: no store given", naming a flag `lmdata run` does not have."""
    from lmdata.pipeline import load_sections

    path = tmp_path / "p.toml"
    path.write_text(BASE.replace('out = "store"\n', ""))
    with pytest.raises(LmdataError, match=r'p.toml: \[ingest\] has no out; set out = "STORE"'):
        load_sections(path)
