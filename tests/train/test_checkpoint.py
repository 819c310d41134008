"""Checkpoint files: atomic names, keep-last-K, RNG round trip, weights_only-safe contents."""

from __future__ import annotations

import os
import pickle
import random

import numpy as np
import pytest
import torch

from lmdata.errors import LmdataError
from lmdata.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from lmdata.train.optim import AdamW


def _model_and_opt():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return model, opt


def test_keep_last_k_and_no_temporaries(tmp_path):
    model, opt = _model_and_opt()
    for step in (5, 10, 15, 20):
        save_checkpoint(tmp_path, model, opt, step, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-00000015.pt", "ckpt-00000020.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000015.pt", "ckpt-00000020.pt"]
    (tmp_path / ".ckpt-00000025.pt.tmp-1").write_bytes(b"partial")  # a crash mid-write
    assert latest_checkpoint(tmp_path).name == "ckpt-00000020.pt"


def test_round_trip_restores_model_optimizer_rng_and_numpy_loader_state(tmp_path):
    model, opt = _model_and_opt()
    loader_state = {"epoch": np.int64(3), "batch": 7, "order": np.arange(4)}
    path = save_checkpoint(tmp_path, model, opt, 1, loader_state=loader_state, meta={"hash": "abc"})
    want = (random.random(), np.random.rand(), torch.rand(1))
    model2, opt2 = torch.nn.Linear(3, 2), AdamW(torch.nn.Linear(3, 2).parameters())
    opt2 = AdamW(model2.parameters(), lr=0.1)
    payload = load_checkpoint(path, model2, opt2)
    assert (random.random(), np.random.rand(), torch.rand(1)) == want  # generators rewound to the save
    assert payload["loader"]["epoch"] == 3 and isinstance(payload["loader"]["epoch"], int)
    assert torch.equal(payload["loader"]["order"], torch.arange(4))
    assert payload["meta"] == {"hash": "abc"}
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)
    assert opt2.state_dict()["state"][0]["step"] == 1


def test_refusals_name_the_file(tmp_path):
    model, opt = _model_and_opt()
    path = save_checkpoint(tmp_path, model, opt, 1)
    with pytest.raises(LmdataError, match="ckpt-00000001.pt.*do not fit"):
        load_checkpoint(path, torch.nn.Linear(5, 2))
    with pytest.raises(LmdataError, match="refused"):
        load_checkpoint(path, check_meta=lambda meta: (_ for _ in ()).throw(LmdataError("refused")))
    evil = tmp_path / "evil.pt"
    torch.save({"version": 1, "model": {}, "x": object}, evil)  # a pickled global: weights_only refuses
    with pytest.raises(LmdataError, match="evil.pt"):
        load_checkpoint(evil)
    with pytest.raises(LmdataError, match="no such file"):
        load_checkpoint(tmp_path / "missing.pt")


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("how", ["torch.save", "raw pickle"])
def test_a_crafted_checkpoint_is_refused_as_unsafe_not_truncated(tmp_path, how):
    crafted = tmp_path / "ckpt-00000001.pt"
    payload = {"version": 1, "model": {}, "x": _RunsCode()}
    if how == "torch.save":
        torch.save(payload, crafted)
    else:
        crafted.write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(LmdataError) as err:
        load_checkpoint(crafted)
    msg = str(err.value)
    assert "ckpt-00000001.pt" in msg and "unsafe" in msg and "system" in msg and "truncated" not in msg


def test_a_text_file_given_as_a_checkpoint_is_not_a_checkpoint_not_unsafe(tmp_path):
    """A text file read by torch's unpickler had been reported as pickled code ("Unsupported operand 70")."""
    text = tmp_path / "sample.txt"
    text.write_text("Once upon a time there was a checkpoint.\n")
    with pytest.raises(LmdataError) as err:
        load_checkpoint(text)
    msg = str(err.value)
    assert "sample.txt: not a checkpoint" in msg and "unsafe" not in msg
