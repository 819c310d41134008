"""Every CLI command against every class of damage (issue 19, case 6): exit 1, one line, no traceback.

Store damage (a fresh copy of the sample store each): a manifest field of the wrong type, a
manifest that is not JSON, no manifest, a truncated shard file, a missing shard file, a
flipped byte in every shard file of every format (same size: only a checksum sees it), and
a store path that does not exist -- against inspect, sql (docs and tokens views), show,
verify, train and bench. Input damage against ingest and tokenizer training, checkpoint
damage against sample.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lmdata.cli import main


def _set(obj, path, value):
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value


def wrong_type(store: Path) -> None:
    m = json.loads((store / "manifest.json").read_text())
    _set(m, ["splits", "train", "formats", "parquet", "shards", 0, "extra", "rows"], "many")
    _set(m, ["splits", "train", "formats", "memmap", "shards", 0, "files", 0, "path"], None)
    (store / "manifest.json").write_text(json.dumps(m))


def not_json(store: Path) -> None:
    path = store / "manifest.json"
    path.write_bytes(path.read_bytes()[:100])


def no_manifest(store: Path) -> None:
    (store / "manifest.json").unlink()


def truncated_shard(store: Path) -> None:
    for path in (store / "train" / "memmap").glob("tokens-*.bin"):
        path.write_bytes(path.read_bytes()[:-10])


def missing_shard(store: Path) -> None:
    for path in (store / "train" / "memmap").glob("docs-*.npy"):
        path.unlink()


def flipped_bytes(store: Path) -> None:
    m = json.loads((store / "manifest.json").read_text())
    for split, info in m["splits"].items():
        for fmt, entry in info["formats"].items():
            for shard in entry["shards"]:
                for f in shard["files"]:
                    path = store / split / fmt / f["path"]
                    data = bytearray(path.read_bytes())
                    for k in range(len(data) // 2, min(len(data), len(data) // 2 + 8)):
                        data[k] ^= 0x5A
                    path.write_bytes(bytes(data))


def gone(store: Path) -> None:
    shutil.rmtree(store)


STORE_DAMAGE = [wrong_type, not_json, no_manifest, truncated_shard, missing_shard, flipped_bytes, gone]


def store_commands(store: Path, out: Path) -> dict[str, list[str]]:
    s = str(store)
    return {
        "inspect": ["inspect", s],
        "sql docs": ["sql", s, "SELECT sum(n_tokens) FROM docs"],
        "sql tokens": ["sql", s, "SELECT sum(len(tokens)) FROM tokens"],
        "show": ["show", s, "--doc", "0"],
        "verify": ["verify", s],
        "train": ["train", "--store", s, "--out", str(out / "train"), "--steps", "2", "--batch-size", "2",
                  "--seq-len", "16", "--device", "cpu", "--val-split", "none"],
        "bench": ["bench", "--store", s, "--out", str(out / "bench"), "--loader-workers", "0", "--steps", "2",
                  "--batch-size", "2", "--seq-len", "16", "--step-ms", "0.1"],
    }


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI; it must exit 1 with one ``error: ...`` line and no traceback (progress bars and
    report lines before it are output, not part of the error). Returns the error line."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 1, (argv, err)
    assert "Traceback" not in err and err.count("error: ") == 1, (argv, err)
    line = err[err.index("error: "):]
    assert line.strip() and "\n" not in line.rstrip("\n"), (argv, err)
    return line.strip()


@pytest.mark.parametrize("damage", STORE_DAMAGE, ids=lambda f: f.__name__)
def test_every_store_command_refuses_damage_in_one_line(sample_store, tmp_path, capsys, damage):
    store = tmp_path / "store"
    shutil.copytree(sample_store, store)
    damage(store)
    for name, argv in store_commands(store, tmp_path).items():
        if name == "bench" and damage is flipped_bytes:
            continue  # bench reads with verify="size" by design (it measures reads): sizes only
        if name == "sql tokens" and damage in (truncated_shard, missing_shard):
            continue  # the tokens view reads Parquet's rows, which are sound: a format is checked when it is read
        if name == "sql docs" and damage is truncated_shard:
            continue  # it reads the documents' bounds, not the token files: a shard file is checked when it is read
        if name in ("train", "bench") and damage is missing_shard:
            continue  # the loader reads the token files, not the documents' bounds (docs-*.npy)
        line = one_line_error(capsys, argv)
        assert str(store) in line, (name, line)


def test_ingest_and_tokenizer_refuse_bad_input_in_one_line(tokenizer_dir, tmp_path, capsys):
    bad_utf8, surrogate, broken_tok = tmp_path / "bad.txt", tmp_path / "bad.jsonl", tmp_path / "tok"
    bad_utf8.write_bytes(b"fine\n<|endoftext|>\nbro\xffken\n")
    surrogate.write_text('{"text": "half \\ud800"}\n')
    shutil.copytree(tokenizer_dir, broken_tok)
    (broken_tok / "vocab.json").write_text("{not json")
    (tmp_path / "a-file").write_text("x")
    ingest = ["ingest", "--tokenizer", str(tokenizer_dir), "--no-progress"]
    cases = {
        "missing input": ingest + ["--input", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o1")],
        "invalid UTF-8": ingest + ["--input", str(bad_utf8), "--out", str(tmp_path / "o2")],
        "lone surrogate": ingest + ["--input", str(surrogate), "--out", str(tmp_path / "o3")],
        "--out is a file": ingest + ["--input", str(bad_utf8), "--out", str(tmp_path / "a-file")],
        "broken tokenizer": ["ingest", "--tokenizer", str(broken_tok), "--input", str(bad_utf8), "--no-progress",
                             "--out", str(tmp_path / "o4")],
        "tokenizer input not UTF-8": ["tokenizer", "train", str(bad_utf8), "--vocab-size", "300", "--out",
                                      str(tmp_path / "t")],
    }
    for name, argv in cases.items():
        one_line_error(capsys, argv)


def test_sample_refuses_a_damaged_checkpoint_in_one_line(tmp_path, capsys):
    ckpt = tmp_path / "ckpt-00000001.pt"
    ckpt.write_bytes(b"PK\x03\x04 not a checkpoint")
    assert str(ckpt) in one_line_error(capsys, ["sample", str(ckpt), "--max-tokens", "2"])
    (tmp_path / "run").mkdir()
    assert str(tmp_path / "run") in one_line_error(capsys, ["sample", str(tmp_path / "run"), "--max-tokens", "2"])


def test_a_library_io_error_at_the_top_is_one_line_naming_the_file(monkeypatch, capsys, tmp_path):
    """What no layer below turned into ours (a pyarrow/Lance/OS error) still reaches the user as
    one line naming the file and the fix."""
    import errno

    from lmdata.cli import os_error_line

    def boom(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files", str(tmp_path / "x.parquet"))

    monkeypatch.setattr("lmdata.store.open_store", boom)
    monkeypatch.setattr("lmdata.inspect.stats.open_store", boom)
    line = one_line_error(capsys, ["inspect", str(tmp_path)])
    assert line == f"error: {tmp_path / 'x.parquet'}: Too many open files; raise the open-file limit (ulimit -n)"
    assert os_error_line(OSError("1044914 requested and 1021952 written")).endswith("write elsewhere")
