"""`train` and `lmdata run` with the store at s3:// (a real S3 server on loopback)."""

from __future__ import annotations

import textwrap

from samples import SAMPLE

from lmdata.config import TrainConfig
from lmdata.ingest import ingest
from lmdata.sources import SourceSpec
from lmdata.train.checkpoint import read_checkpoint
from lmdata.train.loop import train


def _cfg(store, out, **kw) -> TrainConfig:
    base = dict(store=str(store), out=str(out), batch_size=4, steps=6, warmup=2, eval_every=0, eval_batches=1,
                ckpt_every=6, log_every=3, progress=False, split="train", val_split="")
    return TrainConfig(**{**base, **kw})


def test_train_from_s3_equals_training_from_the_local_store(s3, sample_store, tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    uri = s3.uri("stores", "sample")
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, uri, formats=["memmap"], shard_tokens=100_000,
           workers=1, progress=False, log=None)
    local = tmp_path / "local"
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, local, formats=["memmap"], shard_tokens=100_000,
           workers=1, progress=False, log=None)
    remote_run = train(_cfg(uri, tmp_path / "remote"))
    local_run = train(_cfg(local, tmp_path / "local-run"))
    assert remote_run.losses == local_run.losses
    meta = read_checkpoint(remote_run.checkpoint)["meta"]
    assert meta["store"] == uri  # the URI as given, never Path()-folded to 's3:/...'
    assert (tmp_path / "remote" / "checkpoints" / "tokenizer").is_dir()  # fetched from the store
    resumed = train(_cfg(uri, tmp_path / "remote", steps=8, resume=True))
    assert resumed.start_step == 6


def test_run_pipeline_with_its_store_on_s3(s3, tokenizer_dir, tmp_path, monkeypatch):
    from lmdata.pipeline import run_pipeline
    from lmdata.store import verify_store

    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    uri = s3.uri("runs", "store")
    (tmp_path / "p.toml").write_text(textwrap.dedent(f"""
        [tokenizer]
        dir = "{tokenizer_dir}"
        [ingest]
        out = "{uri}"
        formats = ["memmap"]
        shard_tokens = 100000
        workers = 1
        [ingest.splits.train]
        sources = ["{SAMPLE}"]
        [ingest.holdout]
        documents = 6
        [train]
        out = "run"
        batch_size = 4
        eval_every = 2
        eval_batches = 1
        ckpt_every = 2
        [sample]
        max_tokens = 5
    """))
    result = run_pipeline(tmp_path / "p.toml", steps=2, skip_bench=True, progress=False, log=None)
    assert str(result.store) == uri and verify_store(uri).ok and result.checkpoint.is_file()
    again = run_pipeline(tmp_path / "p.toml", steps=2, skip_bench=True, progress=False, log=None)
    assert "store" in again.reused and "checkpoint" in again.reused
