"""`lmdata train` / `lmdata sample` through the CLI, a pipeline file, and torchrun DDP."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from samples import run_cli

from lmdata.train.checkpoint import read_checkpoint
from lmdata.train.sample import generate, top_p_filter

FLAGS = ["--batch-size", "4", "--warmup", "2", "--eval-batches", "1", "--log-every", "2", "--no-progress"]


def test_train_then_sample(sample_store, tmp_path, capsys):
    out = tmp_path / "run"
    code, text, err = run_cli(["train", "--store", str(sample_store), "--out", str(out), "--steps", "4", *FLAGS], capsys)
    assert code == 0, err
    assert "step      4  loss" in text and "data-wait" in text and "val loss" in text
    assert (out / "checkpoints" / "tokenizer" / "vocab.json").is_file()
    code, text, err = run_cli(["sample", str(out), "--prompt", "The people", "--max-tokens", "12", "--seed", "1"], capsys)
    assert code == 0, err
    assert text.startswith("The people") and len(text) > len("The people\n")
    again = run_cli(["sample", str(out), "--prompt", "The people", "--max-tokens", "12", "--seed", "1"], capsys)[1]
    assert again == text  # the seed fixes the sample


def _run_whose_store_moved(sample_store, tmp_path, capsys):
    """A 2-step run whose checkpoint names a store path that no longer exists."""
    out = tmp_path / "run"
    assert run_cli(["train", "--store", str(sample_store), "--out", str(out), "--steps", "2", *FLAGS], capsys)[0] == 0
    ckpt = out / "checkpoints" / "ckpt-00000002.pt"
    payload = read_checkpoint(ckpt)
    payload["meta"]["store"] = str(tmp_path / "moved-away")
    torch.save(payload, ckpt)
    return out, ckpt


def test_sample_uses_the_tokenizer_copy_when_the_store_moved(sample_store, tmp_path, capsys):
    out, ckpt = _run_whose_store_moved(sample_store, tmp_path, capsys)
    code, text, err = run_cli(["sample", str(ckpt), "--prompt", "We", "--max-tokens", "5"], capsys)
    assert code == 0, err
    assert text.startswith("We")


def test_pipeline_file_and_flag_override(sample_store, tmp_path, capsys):
    pipe = tmp_path / "p.toml"
    pipe.write_text(f'[train]\nstore = "{sample_store}"\nsteps = 3\nbatch_size = 4\nout = "{tmp_path / "run"}"\n'
                    'log_every = 1\nprogress = false\nval_split = "none"\n')
    code, text, err = run_cli(["train", str(pipe), "--steps", "2"], capsys)
    assert code == 0, err
    assert "step      2  loss" in text and "step      3" not in text and "val loss" not in text
    pipe.write_text('[train]\nbatch = 4\n')
    code, _, err = run_cli(["train", str(pipe)], capsys)
    assert code == 1 and "unknown key 'batch'" in err and "batch_size" in err


@pytest.mark.parametrize("args,message", [
    (["--model", "medium"], "--model 'medium': unknown preset; choose one of tiny, small, gpt2-small"),
    (["--seq-len", "100"], "--seq-len 100 is longer than the context_length of model 'tiny'"),
    (["--batch-size", "99999"], "larger than a rank's share"),
    (["--split", "dev"], "no split 'dev'"),
])
def test_bad_input_is_one_line(sample_store, tmp_path, capsys, args, message):
    code, _, err = run_cli(["train", "--store", str(sample_store), "--out", str(tmp_path / "r"), *args], capsys)
    assert code == 1 and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_an_unknown_gpu_is_refused_before_out_is_made(sample_store, tmp_path, capsys):
    """It had been checked after --out got lmdata.json, an empty metrics.jsonl and a tokenizer copy."""
    code, _, err = run_cli(["train", "--store", str(sample_store), "--out", str(tmp_path / "r"), "--gpu", "foo"], capsys)
    assert code == 1 and "--gpu 'foo': unknown accelerator" in err and not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, message", [
    (["--device", "cuda"], "error: --device cuda: this torch build sees no CUDA device; use --device cpu"),
    (["--device", "foo"], "error: --device 'foo': not a device; use auto, cpu, cuda, cuda:N or mps"),
    (["--temperature", "-1"], "error: --temperature -1.0: must be >= 0 and finite (0: greedy)"),
    (["--temperature", "nan"], "error: --temperature nan: must be >= 0 and finite (0: greedy)"),
    (["--top-p", "0"], "error: --top-p 0.0: must be in (0, 1]"),
])
def test_sample_names_the_flag_in_one_line(tmp_path, capsys, args, message):
    """--device cuda on a CPU build had been torch's 43-line traceback."""
    if args[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    code, _, err = run_cli(["sample", str(tmp_path), *args], capsys)
    assert code == 1 and err.strip() == message


@pytest.mark.parametrize("args, message", [
    (["--vocab-size", "-5"], "error: --vocab-size -5: must be >= 1 (0 = the preset's)"),
    (["--seq-len", "100000"], "error: --seq-len 100000 is longer than the context_length of model 'tiny', 64"),
])
def test_plan_refuses_what_train_refuses(capsys, args, message):
    code, _, err = run_cli(["plan", "--model", "tiny", *args], capsys)
    assert code == 1 and err.strip().startswith(message)


def test_top_p_and_greedy():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    torch.testing.assert_close(top_p_filter(probs, 0.7), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    torch.testing.assert_close(top_p_filter(probs, 0.1), torch.tensor([1.0, 0.0, 0.0, 0.0]))

    class Fixed(torch.nn.Module):  # always predicts (id + 1) % 5; id 3 is end-of-text
        context_length = 8

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, ids):
            return torch.nn.functional.one_hot((ids + 1) % 5, 5).float() * 50

    assert generate(Fixed(), [0], 10, eot_id=3, temperature=0) == [1, 2, 3]
    assert generate(Fixed(), [0], 10, eot_id=3, temperature=1.0, top_p=0.9) == [1, 2, 3]


def test_torchrun_ddp_two_ranks(sample_store, tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "lmdata", "train", "--store", str(sample_store),
           "--out", str(out), "--steps", "3", "--ckpt-every", "3", "--eval-every", "0", *FLAGS]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "on cpu x2" in proc.stdout and proc.stdout.count("step      2  loss") == 1  # rank 0 logs alone
    payload = read_checkpoint(out / "checkpoints" / "ckpt-00000003.pt")
    assert [(s["rank"], s["world_size"], s["batch"]) for s in payload["loader"]] == [(0, 2, 3), (1, 2, 3)]


def _another_tokenizer(where: Path) -> None:
    import shutil

    from lmdata.tokenizer import Tokenizer

    shutil.rmtree(where)
    Tokenizer({i: bytes([i]) for i in range(256)}, [], ["<|endoftext|>"]).save(where)


def test_train_refuses_a_store_whose_tokenizer_fails_its_hash(sample_store, tmp_path, capsys):
    """Issue 29.3: train took the store's replaced tokenizer/ (show refused it) and copied it beside the checkpoints."""
    import shutil

    store = tmp_path / "store"
    shutil.copytree(sample_store, store)
    _another_tokenizer(store / "tokenizer")
    out = tmp_path / "run"
    code, _, err = run_cli(["train", "--store", str(store), "--out", str(out), "--steps", "2", *FLAGS], capsys)
    assert code == 1 and err.count("\n") == 1 and "does not match the manifest" in err, err
    assert not (out / "checkpoints" / "tokenizer").exists()


def test_sample_refuses_a_tokenizer_copy_that_is_not_the_checkpoints(sample_store, tmp_path, capsys):
    """Issue 29.3: sample decoded with whatever tokenizer sat beside the checkpoint once the store moved."""
    out, ckpt = _run_whose_store_moved(sample_store, tmp_path, capsys)
    _another_tokenizer(out / "checkpoints" / "tokenizer")
    code, text, err = run_cli(["sample", str(ckpt), "--prompt", "We", "--max-tokens", "5"], capsys)
    assert code == 1 and text == "" and err.count("\n") == 1 and "is not the one checkpoint" in err, err


@pytest.mark.parametrize("edit,message", [
    ({"num_layers": 1_000_000}, "num_layers 1000000, its weights have"),  # before: allocated until memory ran out
    ({"d_model": 96}, "in the weights"),
    ({"d_ff": 1}, "in the weights"),
    ({"heads": 2}, "cannot build a model"),
])
def test_sample_and_export_refuse_a_model_config_that_does_not_fit_the_weights(sample_store, tmp_path, capsys,
                                                                               edit, message):
    """Issue 29.15: a checkpoint whose meta.model_config does not fit its weights was a traceback."""
    out = tmp_path / "run"
    assert run_cli(["train", "--store", str(sample_store), "--out", str(out), "--steps", "2", *FLAGS], capsys)[0] == 0
    ckpt = out / "checkpoints" / "ckpt-00000002.pt"
    payload = read_checkpoint(ckpt)
    payload["meta"]["model_config"].update(edit)
    torch.save(payload, ckpt)
    for argv in (["sample", str(ckpt), "--prompt", "We", "--max-tokens", "3"],
                 ["export", str(ckpt), "--to", "hf", "--out", str(tmp_path / "hf")]):
        code, text, err = run_cli(argv, capsys)
        assert code == 1 and text == "" and err.count("\n") == 1 and message in err and str(ckpt) in err, (argv, err)
