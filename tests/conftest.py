"""Shared fixtures: one small tokenizer and one sample store per session (kept read-only),
and a real S3 server on loopback (moto).

``s3_server`` starts ``moto_server -H 127.0.0.1 -p PORT`` once per test session (installed by
the ``dev`` extra) and stops it by its PID at the end; ``s3`` gives each test a fresh bucket
and points the standard AWS environment at the server, so lmdata's code under test finds it
exactly as a user's would. Objects on it must stay small: moto reads a whole object for each
ranged GET.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from samples import FORMATS, HOLDOUT, SAMPLE, SAMPLE_SHARD_TOKENS

from lmdata.ingest import ingest
from lmdata.sources import SourceSpec


def pytest_sessionfinish(session, exitstatus):
    """Kill child processes a failed test left behind: multiprocessing joins them at exit, and one
    hung child (a forked Lance reader did, once) then held the suite past CI's time limit."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()


@pytest.fixture(autouse=True)
def private_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """lmdata's local cache (decoded Parquet shards, remote tokenizers, staging) in a directory of each
    test's own, never the user's ~/.cache: a test that damages a shard meets no copy decoded by another
    test from the sound file (copies are content-addressed). Subprocesses inherit it."""
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path_factory.mktemp("lmdata-cache")))
    # copies of remote shards whatever this machine's disk holds: with the default tenth kept free,
    # a CI disk 90% full turned copies off and failed eight tests that read them
    monkeypatch.setenv("LMDATA_CACHE_KEEP_FREE", "0")


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 512-id BPE trained on the shipped sample (< 1 s)."""
    from lmdata.tokenizer import Tokenizer, train_bpe

    vocab, merges = train_bpe(str(SAMPLE), 512, ["<|endoftext|>"], workers=1)
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    Tokenizer(vocab, merges, ["<|endoftext|>"]).save(out)
    return out


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir: Path):
    from lmdata.tokenizer import Tokenizer

    return Tokenizer.load(tokenizer_dir)


@pytest.fixture(scope="session")
def sample_store(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """data/sample.txt in every format, last 6 documents held out as `validation`. Do not modify."""
    out = tmp_path_factory.mktemp("stores") / "sample"
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, out, formats=FORMATS,
           shard_tokens=SAMPLE_SHARD_TOKENS, workers=1, holdout=("train", "validation", HOLDOUT), progress=False, log=None)
    return out


@pytest.fixture
def tokens():
    """A toy token stream (tests/toyformat.py) for the dataset and loader tests."""
    from toyformat import make_tokens

    return make_tokens(20_011)


@pytest.fixture
def reader(tmp_path: Path, tokens):
    """A toy reader over ``tokens`` (an .npy file), picklable to spawned workers."""
    from toyformat import write_tokens

    return write_tokens(tmp_path / "tokens.npy", tokens)


@pytest.fixture
def small_fs(tmp_path):
    """``small_fs(size)``: a fresh tmpfs of ``size`` (e.g. "600k") mounted under ``tmp_path``, unmounted after.

    Mounting needs root (or CAP_SYS_ADMIN) and a kernel/container that permits it: where it
    is refused the test is skipped, saying so (issue 19: full-disk tests run where they can).
    """
    mounts: list[Path] = []

    def make(size: str) -> Path:
        point = tmp_path / f"fs-{len(mounts)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a {size} tmpfs here ({done.stderr.strip() or done.returncode}); "
                        "the full-disk test needs root and a kernel that permits tmpfs mounts")
        mounts.append(point)
        return point

    def resize(point: Path, size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(point)], check=True)

    make.resize = resize
    yield make
    for point in reversed(mounts):
        subprocess.run(["umount", "-l", str(point)], capture_output=True)


# ---------------------------------------------------------------------------- S3 on loopback


@dataclass
class S3Server:
    endpoint: str  # http://127.0.0.1:PORT
    pid: int

    @property
    def host_port(self) -> str:
        return self.endpoint.split("://", 1)[1]

    def make_bucket(self, name: str) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/{name}", method="PUT"), timeout=10).read()


@dataclass
class S3:
    server: S3Server
    bucket: str

    def uri(self, *parts: str) -> str:
        return "s3://" + "/".join((self.bucket,) + parts)

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.server.endpoint, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def put(self, key: str, data: bytes) -> str:
        """Upload ``data`` with boto3, byte for byte as `aws s3 cp` would; returns its URI."""
        self.client().put_object(Bucket=self.bucket, Key=key, Body=data)
        return self.uri(key)

    def get(self, key: str) -> bytes:
        """The object's stored bytes, as boto3 sees them."""
        return self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _moto_server() -> str:
    exe = Path(sys.executable).with_name("moto_server")
    found = str(exe) if exe.exists() else shutil.which("moto_server")
    if not found:
        pytest.fail("moto_server is not installed: run `bash scripts/setup.sh dev,ray` (the dev extra has moto[server])")
    return found


def _start_moto(log: Path, extra_env: dict[str, str] | None = None) -> tuple[S3Server, subprocess.Popen]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | (extra_env or {})
    with open(log, "wb") as out:
        proc = subprocess.Popen([_moto_server(), "-H", "127.0.0.1", "-p", str(port)], stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{port}", proc.pid)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(server.endpoint + "/", timeout=1).read()
            return server, proc
        except urllib.error.HTTPError:
            return server, proc  # it answers (an auth-checking server says 403)
        except (urllib.error.URLError, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto_server did not start on {server.endpoint}: {log.read_text()[-2000:]}")
            time.sleep(0.1)


def _stop_moto(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory):
    server, proc = _start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server
    finally:
        _stop_moto(proc)


@pytest.fixture
def s3_auth_server(tmp_path: Path):
    """A second server that checks credentials; it knows none, so every key is wrong."""
    server, proc = _start_moto(tmp_path / "moto-auth.log", {"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        yield server
    finally:
        _stop_moto(proc)


def aws_env(endpoint: str) -> dict[str, str]:
    """The standard AWS environment pointing at ``endpoint`` (what a user would export)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_REQUEST_CHECKSUM_CALCULATION": "WHEN_REQUIRED",
        "AWS_RESPONSE_CHECKSUM_VALIDATION": "WHEN_REQUIRED",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3:
    """A fresh bucket on the session's server, with the AWS environment pointing at it."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    for key, value in aws_env(s3_server.endpoint).items():
        monkeypatch.setenv(key, value)
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3_server.make_bucket(bucket)
    return S3(s3_server, bucket)


@pytest.fixture(scope="session")
def s3_env(s3_server: S3Server) -> dict[str, str]:
    """``aws_env`` of the session's server (for module-scoped fixtures that set it themselves)."""
    return aws_env(s3_server.endpoint)
