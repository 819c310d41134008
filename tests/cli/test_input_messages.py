"""What a newcomer's slips are told: one line naming the argument and what to give instead, exit 1,
nothing written (a directory given as input, a file given for a directory and the other way round)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmdata.cli import main

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample.txt"


def _one_line(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 1 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_a_directory_as_input_suggests_a_glob_without_a_double_slash(tokenizer_dir, tmp_path, capsys):
    err = _one_line(["ingest", "--input", str(SAMPLE.parent) + "/", "--tokenizer", str(tokenizer_dir),
                     "--out", str(tmp_path / "s"), "-q"], capsys)
    assert f"pass a glob such as '{SAMPLE.parent}/*.txt'" in err and not (tmp_path / "s").exists()


def test_a_tokenizer_file_is_not_a_tokenizer_directory(tokenizer_dir, tmp_path, capsys):
    some_file = next(p for p in sorted(Path(tokenizer_dir).iterdir()) if p.is_file())
    err = _one_line(["ingest", "--input", str(SAMPLE), "--tokenizer", str(some_file), "--out", str(tmp_path / "s"),
                     "-q"], capsys)
    assert f"{some_file}: a file, not a tokenizer directory" in err and not (tmp_path / "s").exists()


def test_an_out_that_is_a_file_is_named_as_one(tokenizer_dir, tmp_path, capsys):
    out = tmp_path / "taken.txt"
    out.write_text("mine\n")
    err = _one_line(["ingest", "--input", str(SAMPLE), "--tokenizer", str(tokenizer_dir), "--out", str(out), "-q"],
                    capsys)
    assert f"--out {out}: exists and is not a directory" in err and out.read_text() == "mine\n"


def test_a_manifest_given_for_its_store_says_give_the_directory(sample_store, capsys):
    err = _one_line(["inspect", str(Path(sample_store) / "manifest.json")], capsys)
    assert "give the store directory that holds manifest.json, not the file" in err


@pytest.mark.parametrize("flag,value,message", [
    ("--shard-tokens", "0", "ingest: --shard-tokens must be positive, got 0"),
    ("--workers", "-1", "ingest: --workers must be >= 0 (0 = all cores), got -1"),
])
def test_ingest_values_are_named_by_their_flags(tokenizer_dir, tmp_path, capsys, flag, value, message):
    err = _one_line(["ingest", "--input", str(SAMPLE), "--tokenizer", str(tokenizer_dir), "--out",
                     str(tmp_path / "s"), flag, value, "-q"], capsys)
    assert message in err and not (tmp_path / "s").exists()


@pytest.mark.parametrize("argv, said", [
    (["ingest", "--shard-tokens", "1.5"], "error: Invalid value for '--shard-tokens': '1.5' is not a valid integer. "
                                          "(see `lmdata ingest --help`)"),
    (["sql"], "error: Missing argument 'STORE'. (see `lmdata sql --help`)"),
    (["nope"], "error: No such command 'nope'. (see `lmdata --help`)"),
])
def test_a_usage_slip_is_one_line_and_exit_2(argv, said, capsys):
    """click's own usage error is four lines (usage, hint, blank, error); every other error is one."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and capsys.readouterr().err.splitlines() == [said]


def test_a_pipeline_that_is_not_utf8_is_one_line(tmp_path, capsys):
    bad = tmp_path / "p.toml"
    bad.write_bytes(b'[ingest]\nout = "\xff\xfe"\n')
    for command in ("run", "ingest", "train", "bench"):
        err = _one_line([command, str(bad)], capsys)
        assert err == f"error: pipeline {bad}: not UTF-8 text (byte 16); a pipeline is a TOML file, saved as UTF-8"


def test_more_encoders_than_one_machine_runs_is_one_line_before_anything_is_written(tokenizer_dir, tmp_path, capsys):
    """--workers 100000 had failed while starting threads: a traceback, and a store's lock and plan left."""
    err = _one_line(["ingest", "--input", str(SAMPLE), "--tokenizer", str(tokenizer_dir), "--out", str(tmp_path / "s"),
                     "--workers", "100000", "-q"], capsys)
    assert "--workers 100000: at most 1,024 encoders on one machine" in err and not (tmp_path / "s").exists()


def test_an_input_link_to_nothing_says_why(tokenizer_dir, tmp_path, capsys):
    """A symbolic link that loops had been reported as 'no such file'."""
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to("gone.txt")
    for name, why in (("loop", "it loops"), ("dangling", "its target gone.txt is missing")):
        err = _one_line(["ingest", "--input", str(tmp_path / name), "--tokenizer", str(tokenizer_dir),
                         "--out", str(tmp_path / "s"), "-q"], capsys)
        assert err == (f"error: input {tmp_path / name}: a symbolic link to nothing readable ({why}); point it at "
                       "the file or give the file itself") and not (tmp_path / "s").exists()


def test_an_s3_servers_xml_error_body_becomes_its_code():
    """A truncated Lance object on S3 had printed a ~900-character line holding the server's XML."""
    from lmdata.cli import _one_line

    body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidRange</Code><Message>The requested range '
            'is not satisfiable</Message><RangeRequested>bytes=900-999</RangeRequested></Error>')
    assert _one_line(f"s3://b/d.lance: 416 Range Not Satisfiable: {body}; re-ingest") == \
        "s3://b/d.lance: 416 Range Not Satisfiable: [InvalidRange]; re-ingest"


@pytest.mark.parametrize("argv", [[], ["tokenizer"]])
def test_a_bare_command_group_prints_its_help_whole(argv, capsys):
    """Since click 8.2 "no arguments: help" is a UsageError; the one-line rule had flattened the help."""
    with pytest.raises(SystemExit):
        main(argv)
    captured = capsys.readouterr()
    shown = captured.out + captured.err
    assert shown.startswith("Usage: lmdata") and "\nCommands:\n" in shown and "error:" not in shown
