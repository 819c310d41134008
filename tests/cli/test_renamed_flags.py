"""Renamed flags keep their old names for a release: one warning line, the same value, hidden from --help.

``--workers`` became ``--loader-workers`` on ``train`` and ``bench`` and ``sql --format`` became
``--output``; users' scripts that still type the old names must not break silently."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lmdata.cli.bench import bench
from lmdata.cli.options import given
from lmdata.cli.train import train
from lmdata.config import BenchConfig, TrainConfig
from lmdata.errors import LmdataError


@pytest.mark.parametrize("command, cls", [(train, TrainConfig), (bench, BenchConfig)])
def test_workers_is_loader_workers_with_one_warning(command, cls, capsys):
    ctx = command.make_context(command.name, ["--workers", "1"])
    assert given(ctx, cls, {k: v for k, v in ctx.params.items()})["workers"] in (1, [1])
    assert capsys.readouterr().err.splitlines() == [
        "warning: --workers is deprecated (it goes in a later release); use --loader-workers"]
    ctx = command.make_context(command.name, ["--loader-workers", "1"])
    assert given(ctx, cls, dict(ctx.params))["workers"] in (1, [1])
    assert capsys.readouterr().err == ""
    ctx = command.make_context(command.name, ["--loader-workers", "1", "--workers", "2"])
    with pytest.raises(LmdataError, match="--loader-workers and its old name --workers both given"):
        given(ctx, cls, dict(ctx.params))
    assert "--workers" not in command.get_help(command.make_context(command.name, []))


def test_sql_format_is_output_with_one_warning(sample_store):
    run = [sys.executable, "-m", "lmdata", "sql", str(sample_store), "select count(*) as n from docs"]
    old = subprocess.run([*run, "--format", "csv"], capture_output=True, text=True)
    new = subprocess.run([*run, "--output", "csv"], capture_output=True, text=True)
    assert old.returncode == new.returncode == 0 and old.stdout == new.stdout and new.stdout.startswith("n\n")
    assert old.stderr.splitlines() == ["warning: --format is deprecated (it goes in a later release); use --output"]
    both = subprocess.run([*run, "--output", "json", "--format", "csv"], capture_output=True, text=True)
    assert both.returncode == 1 and both.stdout == ""
    assert both.stderr.splitlines()[-1] == "error: --output and its old name --format both given; keep --output"


def test_a_flag_typed_by_its_old_name_keeps_its_flag_in_errors(capsys):
    """``untyped``: a value typed under the old name is the new flag's, so an error about it names the flag,
    not the pipeline file's key (and one not typed is still named by the key)."""
    from lmdata.cli.options import untyped
    from lmdata.pipeline import TRAIN_KEYS

    for args in (["--workers", "3"], ["--loader-workers", "3"]):
        left = untyped(train.make_context(train.name, args), TRAIN_KEYS)
        assert "--loader-workers" not in left and "--steps" in left
    assert "--loader-workers" in untyped(train.make_context(train.name, []), TRAIN_KEYS)
    capsys.readouterr()
