"""The Ray engine on a cluster without a shared filesystem writes an s3:// store itself (issue 26).

One ``ray.cluster_utils.Cluster`` of two nodes (1 CPU each) serves the module; each node's raylet,
and so each of its workers, has an ``LMDATA_CACHE_DIR`` of its own, and the driver another: the
tasks cannot see the driver's staging directory, nor each other's. Inputs and store are on moto.
Each test compares its store with the local engine's (built once): plain, with workers killed
around writes, with the second node removed mid-ingest, and resumed after a killed driver.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from lmdata.ingest import ingest
from lmdata.io.location import location
from lmdata.sources import SourceSpec

from formats import FORMATS
from samples import fingerprint, small_tokenizer

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample.txt"
SHARD_TOKENS = 30_000  # the sample (vocab 512) spans ~15 shards
HOLDOUT = ("train", "validation", 6)

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed (pip install 'lmdata[ray]')"),
]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return [tmp_path_factory.mktemp(f"node{i}") for i in range(2)]


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")  # LMDATA_RAY_FAULTS of every node; nothing armed yet


def node_env(cache: Path, faults: Path) -> dict[str, str]:
    return {"LMDATA_CACHE_DIR": str(cache), "LMDATA_RAY_FAULTS": str(faults)}


@pytest.fixture(scope="module")
def cluster(nodes: list[Path], faults: Path):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster()
    for cache in nodes:
        c.add_node(num_cpus=1, env_vars=node_env(cache, faults), include_dashboard=False)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_tokenizer(SAMPLE, tmp_path_factory.mktemp("tok") / "tokenizer")


@pytest.fixture
def driver_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "driver"))
    monkeypatch.setattr("lmdata.ingest.encode.BATCH_BYTES", 1 << 14)  # ~60 batches of the sample
    return tmp_path / "driver"


def write_inputs(bucket: str, data: bytes) -> str:
    """``data`` as three objects of whole documents (the held-out ones span two); their glob."""
    sep = b"\n<|endoftext|>\n"
    ends = [i + len(sep) for i in range(len(data)) if data.startswith(sep, i)]
    bounds = [0, ends[29], ends[57], len(data)]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        location(f"s3://{bucket}/in/part-{i}.txt").write_bytes(data[a:b])
    return f"s3://{bucket}/in/part-*.txt"


@pytest.fixture(scope="module")
def reference(s3_server, s3_env, tokenizer_dir, tmp_path_factory) -> tuple[dict[str, SourceSpec], str]:
    """The sample on moto and the local engine's store of it, built once: (splits, store URI)."""
    bucket = f"ref-{uuid.uuid4().hex[:12]}"
    s3_server.make_bucket(bucket)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3_env.items():
            mp.setenv(key, value)
        mp.setenv("LMDATA_CACHE_DIR", str(tmp_path_factory.mktemp("reference-cache")))
        spec = {"train": SourceSpec((write_inputs(bucket, SAMPLE.read_bytes()),))}
        run(spec, tokenizer_dir, f"s3://{bucket}/local", "local")
    return spec, f"s3://{bucket}/local"


def run(spec, tokenizer_dir: Path, out: str, engine: str, **kw) -> None:
    ingest(spec, tokenizer_dir, out, formats=FORMATS, shard_tokens=SHARD_TOKENS, workers=2, holdout=HOLDOUT,
           progress=False, log=None, engine=engine, **kw)


def driver_script(cluster, spec, tokenizer_dir: Path, out: str) -> str:
    """A separate driver process running the Ray ingest of ``spec`` into ``out`` (to kill, or to outlive a node)."""
    return (
        "import ray, lmdata.ingest.encode as e\n"
        "from lmdata.ingest import ingest\n"
        "from lmdata.sources import SourceSpec\n"
        "e.BATCH_BYTES = 1 << 14\n"
        f"ray.init(address={cluster.address!r}, log_to_driver=False)\n"
        f"ingest({{'train': SourceSpec({spec['train'].paths!r})}}, {str(tokenizer_dir)!r}, {out!r}, "
        f"formats={FORMATS!r}, shard_tokens={SHARD_TOKENS}, holdout={HOLDOUT!r}, progress=False, log=None, "
        "engine='ray')\n"
    )


def objects(uri: str) -> dict[str, bytes]:
    return {x.key: x.loc.read_bytes() for x in location(uri).list(recursive=True)}


def remote_fingerprint(uri: str, tmp: Path) -> dict:
    tmp.mkdir()
    (tmp / "manifest.json").write_bytes((location(uri) / "manifest.json").read_bytes())
    return fingerprint(tmp)


def assert_same_store(a: str, b: str, tmp: Path) -> None:
    """Every object equal byte for byte, but Lance's (its data files have random UUID names, so
    do the records, commits and manifest naming them): those by count, and by every file's checksum
    in the manifest."""
    def plain(objs: dict[str, bytes]) -> dict[str, bytes]:
        return {k: v for k, v in objs.items() if "/lance/" not in k and k != "manifest.json"}

    left, right = objects(a), objects(b)
    lance = [k for k in left if "/lance/" in k]
    assert len(plain(left)) > 100 and plain(left) == plain(right)
    assert len(lance) == len([k for k in right if "/lance/" in k]) > 0
    assert remote_fingerprint(a, tmp / "a") == remote_fingerprint(b, tmp / "b")


def test_ray_tasks_write_the_local_engines_store(cluster, nodes, s3, driver_cache, tokenizer_dir, reference,
                                                tmp_path, monkeypatch):
    """Two nodes, no shared directory: the same objects as the local engine's; the driver fetched
    counts and records only (far fewer bytes than the tokens), hashed no input itself (tasks did,
    for the plan), and the nodes' own caches held the shards."""
    from lmdata.ingest import ray_store
    from lmdata.store import open_store

    def driver_reads(path):
        raise AssertionError(f"the driver read {path} to hash it")

    monkeypatch.setattr("lmdata.ingest.output.describe", driver_reads)
    spec, local = reference
    ray_store.RECEIVED["bytes"] = 0
    run(spec, tokenizer_dir, s3.uri("ray"), "ray")
    assert_same_store(local, s3.uri("ray"), tmp_path)
    store = open_store(s3.uri("ray"))
    token_bytes = store.manifest.splits["train"].n_tokens * 2
    assert 0 < ray_store.RECEIVED["bytes"] < token_bytes / 4
    assert all((node / "ray-shards").is_dir() for node in nodes)  # both nodes wrote shards, each in its own cache
    assert not (driver_cache / "ray-shards").exists()


def test_retried_writes_upload_the_same_objects(cluster, faults, s3, driver_cache, tokenizer_dir, reference,
                                                tmp_path):
    """A worker killed before a write, after a write's upload (its result lost) and while encoding:
    the retries leave exactly the local engine's objects (no Lance data file of a first attempt)."""
    armed = ["encode-1-3", "write-parquet-00002", "wrote-memmap-00003", "wrote-lance-00004"]
    for key in armed:
        (faults / key).touch()
    spec, local = reference
    run(spec, tokenizer_dir, s3.uri("ray"), "ray")
    assert sorted(p.name for p in faults.iterdir()) == sorted(k + ".fired" for k in armed)
    assert_same_store(local, s3.uri("ray"), tmp_path)


def test_bad_input_is_one_line_and_leaves_no_object(cluster, s3, driver_cache, tokenizer_dir):
    """Invalid UTF-8 in the last input, after shards of the first ones were uploaded by tasks: the
    local engine's one line (file, byte), and the fresh prefix is empty again."""
    from lmdata.errors import LmdataError

    data = SAMPLE.read_bytes()
    spec = {"train": SourceSpec((write_inputs(s3.bucket, data[:-40] + b"\xff\xfe" + data[-38:]),))}
    messages = []
    for engine in ("local", "ray"):
        with pytest.raises(LmdataError) as err:
            run(spec, tokenizer_dir, s3.uri(engine), engine)
        messages.append(str(err.value))
        assert [x.key for x in location(s3.uri(engine)).list(recursive=True)] == []
    assert messages[0] == messages[1] and "\n" not in messages[1]
    assert "part-2.txt" in messages[1] and "byte" in messages[1]


def test_a_killed_driver_resumes_from_the_store(cluster, s3, driver_cache, tokenizer_dir, reference, tmp_path):
    """SIGKILL the driver mid-split: records in the store, no manifest; --resume finishes the same store."""
    spec, local = reference
    out = s3.uri("ray")
    proc = subprocess.Popen([sys.executable, "-c", driver_script(cluster, spec, tokenizer_dir, out)],
                            env=os.environ.copy())
    record = location(out) / "train" / "memmap" / "_shards" / "00003.json"
    deadline = time.monotonic() + 120
    while not record.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert record.exists() and not (location(out) / "manifest.json").exists()
    run(spec, tokenizer_dir, out, "ray", resume=True)
    assert_same_store(local, out, tmp_path)


def test_a_removed_worker_node_is_survived_by_retries(cluster, nodes, faults, s3, driver_cache, tokenizer_dir,
                                                      reference, tmp_path):
    """The node that is not the driver's goes away while a write task runs there (its workers, its
    objects, its cache): Ray's retries and lineage redo what was lost; nothing is lost or doubled."""
    spec, local = reference
    out = s3.uri("ray")
    worker = next(iter(cluster.worker_nodes))  # not the head: the driver's node stays
    hold, held = faults / "hold", faults / "held"
    hold.write_text(str(nodes[1]))  # that node's first store write waits, in progress, until the node is gone
    proc = subprocess.Popen([sys.executable, "-c", driver_script(cluster, spec, tokenizer_dir, out)],
                            env=os.environ.copy())
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and not held.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert held.exists(), "no write ran on the second node"
        cluster.remove_node(worker, allow_graceful=False)
        assert proc.wait(timeout=300) == 0
    finally:
        hold.unlink(missing_ok=True)
        held.unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
        if not cluster.worker_nodes:  # the module's other tests get their two nodes back
            cluster.add_node(num_cpus=1, env_vars=node_env(nodes[1], faults), include_dashboard=False)
            cluster.wait_for_nodes()
    assert_same_store(local, out, tmp_path)
