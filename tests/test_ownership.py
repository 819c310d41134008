"""lmdata deletes or replaces only what it wrote: every command with an output directory.

Each case points a command at a folder of a user's files (a web project with its own
``manifest.json``, a Hugging Face model folder with its ``tokenizer.json``, ...) and checks
that the command is refused with one ``error:`` line naming the directory and that every
file is byte-identical afterwards (a hash of the whole tree before and after).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from samples import run_cli
from test_e2e import dump_toml

from lmdata.cli import main

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample.txt"


def tree_hash(root: Path) -> dict[str, str]:
    """Every path under ``root`` -> sha256 of its bytes ('dir' for directories)."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def run(args: list[str], capsys) -> tuple[int, str]:
    code, _, err = run_cli(args, capsys)
    return code, err


def refused(args: list[str], folder: Path, capsys, *names: str) -> str:
    """Run ``args``; assert exit 1, one error line naming ``folder`` (and ``names``), the tree untouched."""
    before = tree_hash(folder)
    code, err = run(args, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(folder) in lines[0], err
    for name in names:
        assert name in lines[0], err
    assert tree_hash(folder) == before
    return lines[0]


def web_project(root: Path) -> Path:
    """A user's project: sources, a .git, a README and a web app's manifest.json."""
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.js").write_text("console.log('hi')\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / "README.md").write_text("# my app\n")
    (root / "manifest.json").write_text(json.dumps({"name": "My App", "version": "1.0", "manifest_version": 3}))
    return root


def hf_model_folder(root: Path) -> Path:
    """A Hugging Face model folder: tokenizer.json next to config.json and the weights."""
    root.mkdir(parents=True)
    (root / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
    (root / "vocab.json").write_text("{}")
    (root / "merges.txt").write_text("#version: 0.2\n")
    (root / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (root / "model.safetensors").write_bytes(b"\x00weights" * 100)
    return root


def user_folder(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("my notes\n")
    (root / "loss.png").write_bytes(b"my own plot")
    return root


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> dict[str, Path]:
    """A tokenizer and a one-format store, made through the CLI."""
    root = tmp_path_factory.mktemp("own")
    tok, store = root / "tok", root / "store"
    main(["tokenizer", "train", str(SAMPLE), "--vocab-size", "300", "--out", str(tok), "--workers", "1",
          "--no-progress"])
    main(["ingest", "--input", str(SAMPLE), "--tokenizer", str(tok), "--out", str(store), "--format", "memmap",
          "--holdout", "6", "--workers", "1", "--no-progress"])
    return {"tok": tok, "store": store}


@pytest.mark.parametrize("flag", ["--overwrite", "--resume"])
def test_ingest_over_a_web_project(small, tmp_path, capsys, flag):
    folder = web_project(tmp_path / "app")
    refused(["ingest", "--input", str(SAMPLE), "--tokenizer", str(small["tok"]), "--out", str(folder),
             "--format", "memmap", "--no-progress", flag], folder, capsys, "holds no lmdata store")


def test_ingest_over_a_store_with_user_files(small, tmp_path, capsys):
    import shutil

    store = tmp_path / "store"
    shutil.copytree(small["store"], store)
    (store / "README.md").write_text("about my data\n")
    (store / "train" / "memmap" / "notes.txt").write_text("x\n")
    line = refused(["ingest", "--input", str(SAMPLE), "--tokenizer", str(small["tok"]), "--out", str(store),
                    "--format", "memmap", "--holdout", "6", "--no-progress", "--overwrite"], store, capsys,
                   "README.md", "train/memmap/notes.txt")
    assert "did not write" in line
    (store / "README.md").unlink()
    (store / "train" / "memmap" / "notes.txt").unlink()
    code, err = run(["ingest", "--input", str(SAMPLE), "--tokenizer", str(small["tok"]), "--out", str(store),
                     "--format", "memmap", "--holdout", "6", "--no-progress", "--overwrite"], capsys)
    assert code == 0, err  # our own store, and only ours: replaced


def test_tokenizer_train_over_a_hugging_face_folder(tmp_path, capsys):
    folder = hf_model_folder(tmp_path / "gpt2")
    refused(["tokenizer", "train", str(SAMPLE), "--vocab-size", "300", "--out", str(folder), "--workers", "1",
             "--no-progress"], folder, capsys, "not an lmdata tokenizer")


def test_tokenizer_train_over_our_tokenizer_with_user_files(small, tmp_path, capsys):
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(small["tok"], tok)
    (tok / "config.json").write_text("{}")
    refused(["tokenizer", "train", str(SAMPLE), "--vocab-size", "300", "--out", str(tok), "--workers", "1",
             "--no-progress"], tok, capsys, "config.json")


def test_run_fresh_with_a_hugging_face_tokenizer_dir(tmp_path, capsys):
    folder = hf_model_folder(tmp_path / "hf")
    doc = {
        "tokenizer": {"dir": str(folder), "train_files": [str(SAMPLE)], "vocab_size": 300},
        "ingest": {"out": str(tmp_path / "store"), "formats": ["memmap"], "workers": 1,
                   "splits": {"train": {"sources": [str(SAMPLE)]}}},
        "train": {"out": str(tmp_path / "train"), "steps": 1},
        "bench": {"out": str(tmp_path / "bench")},
    }
    (tmp_path / "p.toml").write_text(dump_toml(doc))
    for extra in (["--fresh"], []):
        refused(["run", str(tmp_path / "p.toml"), "--no-progress", "--skip-bench", *extra], folder, capsys,
                "not an lmdata tokenizer")


def test_train_out_over_a_user_folder(small, tmp_path, capsys):
    folder = user_folder(tmp_path / "mine")
    refused(["train", "--store", str(small["store"]), "--out", str(folder), "--steps", "1", "--batch-size", "2",
             "--no-progress"], folder, capsys, "notes.txt")
    (folder / "checkpoints").mkdir()  # a folder of its own called checkpoints is not a run either
    (folder / "notes.txt").unlink()
    (folder / "loss.png").unlink()
    (folder / "checkpoints" / "best.bin").write_bytes(b"user weights")
    refused(["train", "--store", str(small["store"]), "--out", str(folder), "--steps", "1", "--batch-size", "2",
             "--no-progress"], folder, capsys, "checkpoints/best.bin")


def test_train_out_marker_lets_a_run_continue(small, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--store", str(small["store"]), "--out", str(out), "--batch-size", "2", "--no-progress",
            "--eval-every", "0", "--log-every", "1"]
    assert run([*args, "--steps", "1"], capsys)[0] == 0
    assert json.loads((out / "lmdata.json").read_text())["kind"] == "train"
    code, err = run([*args, "--steps", "2", "--resume"], capsys)
    assert code == 0, err


def test_bench_out_over_a_user_folder(small, tmp_path, capsys):
    folder = user_folder(tmp_path / "mine")
    refused(["bench", "--store", str(small["store"]), "--out", str(folder), "--loader-workers", "0", "--steps", "2",
             "--batch-size", "2", "--seq-len", "16"], folder, capsys, "notes.txt")
