"""An S3 endpoint that stops answering mid-run, its sockets left open (issue 29.10).

The store lives on a real S3 server (moto) reached through a loopback proxy; the proxy then
stops forwarding: every request it holds waits, unanswered, on an open connection. Before,
a memmap read failed 187 s later saying "cannot reach" the endpoint and a Lance read 241 s
later calling the store damaged (request timeouts of 30 s, nested retries, and a retry per
sample to find the culprit). Now each format's read fails within ``LMDATA_S3_TIMEOUT``
(retries included), in one line naming the object and the setting.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from samples import SAMPLE

from lmdata.bench.delay_proxy import DelayProxy
from lmdata.errors import LmdataError
from lmdata.ingest import ingest
from lmdata.io.bounded import Bounded
from lmdata.sources import SourceSpec
from lmdata.data import TokenDataset
from lmdata.store import open_store

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 4  # LMDATA_S3_TIMEOUT in these tests
HANG_S = 90  # a read still waiting this long after the freeze hangs (before the fix: 187-241 s)
FROZEN_MS = 1e9  # the proxy holds each request this long: the endpoint never answers


def _remote_store(s3, tokenizer_dir, fmt: str) -> str:
    uri = s3.uri("stores", fmt)
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, uri, formats=[fmt], shard_tokens=200_000,
           workers=1, progress=False, log=None)
    return uri


def _assert_names_the_object_and_the_setting(text: str, fmt: str) -> None:
    assert "\n" not in text, text
    assert f"/stores/{fmt}/train/{fmt}/" in text and text.count("s3://") >= 1, text
    assert f"no answer from 127.0.0.1:" in text and f"within LMDATA_S3_TIMEOUT={TIMEOUT_S} s" in text, text
    assert "damaged" not in text and "cannot reach" not in text, text


@pytest.mark.parametrize("fmt", ["memmap", "lance", "parquet"])
def test_a_frozen_endpoint_fails_a_read_within_the_timeout(s3, s3_server, tokenizer_dir, monkeypatch, fmt):
    uri = _remote_store(s3, tokenizer_dir, fmt)
    # no machine copies (memmap by ranges, Parquet decoded in memory, Lance remote): the background fetch of the
    # split could otherwise make every shard local before the freeze (the next test freezes first)
    for kind in ("MEMMAP", "PARQUET", "LANCE"):
        monkeypatch.setenv(f"LMDATA_{kind}_CACHE_BYTES", "0")
    with DelayProxy(s3_server.host_port) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.setenv("LMDATA_S3_TIMEOUT", str(TIMEOUT_S))
        ds = TokenDataset(open_store(uri).reader("train", fmt), 16)
        assert ds.batch([0, 1]).shape == (2, 17)  # reads through the proxy work
        proxy.delay_ms = FROZEN_MS
        far = [len(ds) - 1, len(ds) // 2]  # never read yet: each needs a request
        read = Bounded(lambda: ds.batch(far))
        assert read.wait(HANG_S), f"a {fmt} read from the frozen endpoint still waited {HANG_S} s later"
        with pytest.raises(LmdataError) as info:
            read.result()
        proxy.delay_ms = 0  # let the held requests go, so the proxy can stop
    _assert_names_the_object_and_the_setting(str(info.value), fmt)


@pytest.mark.parametrize("fmt", ["memmap", "parquet"])
def test_a_frozen_endpoint_fails_a_whole_shard_fetch_within_the_timeout(s3, s3_server, tokenizer_dir, monkeypatch,
                                                                        fmt):
    """The machine's copies (the default): the batch's fetch, and the background fetch it waits on,
    each give up after the timeout; the batch fails naming the object, never hangs."""
    uri = _remote_store(s3, tokenizer_dir, fmt)
    with DelayProxy(s3_server.host_port) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        monkeypatch.setenv("LMDATA_S3_TIMEOUT", str(TIMEOUT_S))
        ds = TokenDataset(open_store(uri).reader("train", fmt), 16)
        assert ds.reader.copies is not None
        proxy.delay_ms = FROZEN_MS  # before any shard is fetched
        read = Bounded(lambda: ds.batch([0, len(ds) - 1]))
        assert read.wait(HANG_S), f"a {fmt} fetch from the frozen endpoint still waited {HANG_S} s later"
        with pytest.raises(LmdataError) as info:
            read.result()
        proxy.delay_ms = 0
    _assert_names_the_object_and_the_setting(str(info.value), fmt)


@pytest.mark.parametrize("fmt,workers", [("lance", 2), ("memmap", 0)])
def test_training_on_a_frozen_endpoint_exits_with_one_line(s3, s3_server, tokenizer_dir, tmp_path, fmt, workers):
    """The issue's run: `lmdata train` from s3://, the endpoint freezing after a few steps."""
    uri = _remote_store(s3, tokenizer_dir, fmt)
    with DelayProxy(s3_server.host_port) as proxy:
        env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "AWS_ENDPOINT_URL": proxy.url,
               "LMDATA_S3_TIMEOUT": str(TIMEOUT_S),
               # no machine copies, so every step needs the endpoint: with them (the default) the
               # sample's few shards are all local after step 3 and training goes on
               "LMDATA_MEMMAP_CACHE_BYTES": "0", "LMDATA_LANCE_CACHE_BYTES": "0"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmdata", "train", "--store", uri, "--format", fmt, "--out", str(tmp_path / "run"),
             "--steps", "100000", "--batch-size", "2", "--seq-len", "16", "--log-every", "1", "--eval-every", "0",
             "--ckpt-every", "100000", "--loader-workers", str(workers), "--batches-per-read", "1", "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        try:
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("step") and int(line.split()[1]) >= 3:
                    break
            assert proc.poll() is None, "".join(lines)[-3000:]
            proxy.delay_ms = FROZEN_MS
            try:
                rest, _ = proc.communicate(timeout=HANG_S)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"lmdata train still ran {HANG_S} s after the endpoint froze") from None
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proxy.delay_ms = 0
    errors = [line for line in rest.splitlines() if not line.startswith("step")]
    assert proc.returncode == 1 and "Traceback" not in rest, rest[-3000:]
    assert len(errors) == 1 and errors[0].startswith("error: "), rest[-3000:]
    _assert_names_the_object_and_the_setting(errors[0], fmt)


@pytest.mark.parametrize("value", ["soon", "0", "-3", "inf"])
def test_a_bad_timeout_setting_is_one_line_naming_it(s3, monkeypatch, value):
    from lmdata.io.s3 import s3_filesystem

    monkeypatch.setenv("LMDATA_S3_TIMEOUT", value)
    with pytest.raises(LmdataError, match=f"^LMDATA_S3_TIMEOUT='{value}': give the seconds") as info:
        s3_filesystem()
    assert "\n" not in str(info.value)
