"""List flags (``--format``, ``--log``, ``--loader-workers``): comma-separated and repeatable alike.

A user who types ``--format memmap --format parquet`` means both; click's last-one-wins had
written parquet alone, silently."""

from __future__ import annotations

from lmdata.cli import main
from lmdata.store import open_store

from samples import SAMPLE


def test_a_repeated_format_flag_adds_up_like_a_comma_list(tmp_path):
    tok = tmp_path / "tok"
    main(["tokenizer", "train", str(SAMPLE), "--vocab-size", "300", "--out", str(tok), "--workers", "1", "-q"])
    for name, flags in (("repeated", ["--format", "memmap", "--format", "parquet"]),
                        ("commas", ["--format", "memmap,parquet"])):
        out = tmp_path / name
        main(["ingest", "--input", str(SAMPLE), "--tokenizer", str(tok), "--out", str(out), *flags, "--workers", "1",
              "-q"])
        assert sorted(open_store(out).manifest.splits["train"].formats) == ["memmap", "parquet"], name


def test_list_flags_parse_each_value_and_keep_defaults_when_not_given():
    import click

    from lmdata.cli.options import given
    from lmdata.config import BenchConfig

    ctx = click.Context(click.Command("bench"))
    for name, source in (("workers", click.core.ParameterSource.COMMANDLINE),
                         ("formats", click.core.ParameterSource.DEFAULT)):
        ctx.set_parameter_source(name, source)
    got = given(ctx, BenchConfig, {"workers": ("0,1", "2"), "formats": ("all",)})
    assert got == {"workers": [0, 1, 2]}
