"""The demo (pipelines/sample.toml's [train], `bash scripts/demo.sh`) learns more than word frequencies.

A model that knows only the unigram distribution of the training split scores its entropy
H1 on held-out text. The demo's defaults must end at least 1 nat below it: 300 steps of
`tiny` from a random init reach 1 nat only by learning context (the old defaults ended
0.33 under, lr 1e-3; bench/README.md "Training defaults" has the sweep). The pipeline's
[tokenizer], [ingest] and [train] are used as shipped; only paths move to tmp_path and the
store is memmap only (the token stream is the same in every format).
"""

from __future__ import annotations

import dataclasses
import tomllib

import numpy as np
import pytest

from lmdata.store import open_store
from lmdata.config import load_train_config
from lmdata.train.loop import train

from test_e2e import dump_toml, sample_pipeline  # tests/ is on sys.path (tests/train is a package)


def unigram_entropy(store, split: str = "train") -> float:
    tokens = store.reader(split).windows(np.array([0]), store.n_tokens(split))[0]
    counts = np.bincount(tokens)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


@pytest.mark.slow
def test_demo_pipeline_ends_a_nat_under_the_unigram_entropy(tmp_path):
    from lmdata.cli import main

    path = sample_pipeline(tmp_path)
    doc = tomllib.loads(path.read_text())
    doc["ingest"]["formats"] = ["memmap"]
    path.write_text(dump_toml(doc))
    main(["ingest", str(path), "--no-progress"])
    cfg = dataclasses.replace(load_train_config(str(path)), progress=False, ckpt_every=0, eval_every=0)
    assert cfg.steps == 300 and cfg.model == "tiny"
    h1 = unigram_entropy(open_store(cfg.store))
    result = train(cfg, log=lambda msg: None)
    assert result.val_loss < h1 - 1.0, (result.val_loss, h1)
