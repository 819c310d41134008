"""`lmdata train --mix` / `[train.mix]`: weighted store splits, exact resume, realised proportions, one tokenizer."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from lmdata.data.mixed import parse_mix_flag
from lmdata.errors import LmdataError
from lmdata.config import TrainConfig, build
from lmdata.train.loop import train

from test_loop import Crash, cfg, crash_at


def _mix(store, w_train=0.75, w_val=0.25):
    return [{"store": str(store), "split": "train", "weight": w_train},
            {"store": str(store), "split": "validation", "weight": w_val}]


def test_mix_flag_and_table_parse():
    assert parse_mix_flag("runs/a:validation=0.3") == {"store": "runs/a", "split": "validation", "weight": 0.3}
    assert parse_mix_flag("runs/a=2") == {"store": "runs/a", "split": "train", "weight": 2.0}
    assert parse_mix_flag("s3://bucket/a/b:train=1")["store"] == "s3://bucket/a/b"
    assert parse_mix_flag("s3://bucket/a/b=1") == {"store": "s3://bucket/a/b", "split": "train", "weight": 1.0}
    for bad in ("runs/a", "runs/a=x", "runs/a=0"):
        with pytest.raises(LmdataError, match="--mix"):
            parse_mix_flag(bad)
    c = build(TrainConfig, {"mix": {"web": {"store": "a", "weight": 3}, "code": {"store": "b", "split": "s", "weight": 1}}}, "[train]")
    assert c.mix == [{"store": "a", "split": "train", "weight": 3.0}, {"store": "b", "split": "s", "weight": 1.0}]
    with pytest.raises(LmdataError, match=r"\[train\]\.mix\.web"):
        build(TrainConfig, {"mix": {"web": {"store": "a", "weigth": 3}}}, "[train]")


def test_mixture_resumes_exactly_and_logs_its_proportions(sample_store, tmp_path):
    kw = dict(mix=_mix(sample_store), steps=20, keep=2, batch_size=8, log_every=10)
    full = train(cfg("", tmp_path / "full", **kw))
    with pytest.raises(Crash):
        train(cfg("", tmp_path / "cut", **kw), log=crash_at(20))  # logged, not yet checkpointed
    resumed = train(cfg("", tmp_path / "cut", resume=True, **kw))
    assert resumed.start_step == 10 and resumed.losses == full.losses[10:]
    recs = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    shares = [r["mix"] for r in recs if r["split"] == "train"][-1]
    # 160 shuffled samples: the share is a draw of sd sqrt(.75 * .25 / 160) = 0.034 around 0.75
    assert list(shares.values()) == pytest.approx([0.75, 0.25], abs=0.12)
    with pytest.raises(LmdataError, match="--mix"):  # another mixture is another run
        train(cfg("", tmp_path / "full", resume=True, **{**kw, "steps": 30, "mix": _mix(sample_store, 0.5, 0.5)}))


def test_realised_proportions_converge(sample_store):
    """Shuffled, the share after n samples is within a few sd of the weight; over an epoch it is the weight."""
    from lmdata.data.loader import make_loader
    from lmdata.data.mixed import MixedDataset
    from lmdata.store import open_store

    store = open_store(sample_store)
    mixed = MixedDataset([(store.dataset("train", 32), 0.7), (store.dataset("validation", 32), 0.3)], seed=3)
    loader = make_loader(mixed, 16, num_workers=0, seed=3)
    counts, share = np.zeros(2), {}
    for b in range(len(loader)):  # the sampler's batches, without reading the tokens
        counts += np.bincount(mixed.locate(loader.sampler.batch(0, b))[0], minlength=2)
        share[b + 1] = counts[0] / counts.sum()
    sd = lambda n: (0.7 * 0.3 / n) ** 0.5  # noqa: E731
    assert abs(share[16] - 0.7) < 5 * sd(256) and abs(share[256] - 0.7) < 5 * sd(4096)
    assert abs(share[len(loader)] - 0.7) < 16 / len(mixed) + 1 / len(mixed)  # whole epoch: only the remainder dropped
    for _ in zip(range(3), loader):  # and the loader's own batches agree with sources_of_batch
        pass
    assert mixed.sources_of_batch(loader).sum() == 16


def test_mixing_stores_of_different_tokenizers_is_refused(sample_store, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(sample_store, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["tokenizer"]["hash"] = "0" * 64
    (other / "manifest.json").write_text(json.dumps(manifest))
    mix = [{"store": str(sample_store), "split": "train", "weight": 1.0},
           {"store": str(other), "split": "train", "weight": 1.0}]
    with pytest.raises(LmdataError, match="--mix: store .*other was ingested with tokenizer 000000000000"):
        train(cfg("", tmp_path / "run", mix=mix))
    assert not (tmp_path / "run").exists()


def test_mix_on_the_command_line(sample_store, tmp_path, capsys):
    from lmdata.cli import main

    main(["train", "--mix", f"{sample_store}:train=3", "--mix", f"{sample_store}:validation=1", "--steps", "4",
          "--batch-size", "4", "--log-every", "4", "--eval-every", "0", "--out", str(tmp_path / "r"), "--no-progress"])
    out = capsys.readouterr().out
    assert "mixture: " in out and "75.0%" in out and "mix " in out.splitlines()[-3] + out


@pytest.mark.parametrize("weight", ["inf", "1e400", "nan", "-inf", "-1"])
def test_mix_weights_must_be_finite_and_positive(weight, tmp_path):
    """An infinite weight starved the other sources silently; two of them were a traceback."""
    with pytest.raises(LmdataError, match=r"--mix .*finite number > 0"):
        parse_mix_flag(f"runs/a={weight}")
    with pytest.raises(LmdataError, match=r"\[train\]\.mix\.web: .*finite number > 0"):
        build(TrainConfig, {"mix": {"web": {"store": "a", "weight": float(weight)}}}, "[train]")


def test_mix_weights_that_overflow_or_vanish_are_refused_in_one_line(sample_store, tmp_path, capsys):
    from lmdata.cli import main

    for a, b, why in (("1e308", "1e308", "sum to infinity"), ("1", "1e-9", "finer than the mixture can draw")):
        with pytest.raises(SystemExit) as e:
            main(["train", "--mix", f"{sample_store}:train={a}", "--mix", f"{sample_store}:validation={b}",
                  "--steps", "1", "--out", str(tmp_path / "r"), "--no-progress"])
        err = capsys.readouterr().err
        assert e.value.code == 1 and why in err and "--mix" in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "r").exists()
