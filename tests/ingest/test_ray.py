"""The Ray engine writes the same store as the local engine (issue 7).

One local Ray (2 CPUs) serves the whole module: starting Ray costs ~7 s, each Ray ingest
of the sample a few seconds. Faults are injected through ``LMDATA_RAY_FAULTS``, which
must be in the environment before Ray starts its workers, so the fixture sets it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lmdata.errors import LmdataError
from lmdata.ingest import ingest
from lmdata.sources import SourceSpec

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample.txt"
from formats import FORMATS
from samples import fingerprint, small_tokenizer
SHARD_TOKENS = 30_000  # the sample (vocab 512) spans ~15 shards
HOLDOUT = ("train", "validation", 6)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray Data copying its own DataContext

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="Ray is not installed (pip install 'lmdata[ray]')")


def stream(store: Path, split: str, fmt: str) -> np.ndarray:
    from lmdata.store import open_store

    reader = open_store(store).reader(split, fmt)
    return reader.windows(np.array([0]), reader.n_tokens)[0]


@pytest.fixture(autouse=True)
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """~16 KB of text per task, so the sample makes ~60 batches to run in parallel and re-order."""
    monkeypatch.setattr("lmdata.ingest.encode.BATCH_BYTES", 1 << 14)


def run(out: Path, tokenizer_dir: Path, engine: str, **kw) -> None:
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, out, formats=FORMATS, shard_tokens=SHARD_TOKENS,
           workers=2, holdout=HOLDOUT, progress=False, log=None, engine=engine, **kw)


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def ray_cluster(faults: Path):
    ray = pytest.importorskip("ray")
    os.environ["LMDATA_RAY_FAULTS"] = str(faults)  # workers inherit it; nothing is armed yet
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    del os.environ["LMDATA_RAY_FAULTS"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return small_tokenizer(SAMPLE, tmp_path_factory.mktemp("tok") / "tokenizer")


@pytest.fixture(scope="module")
def local_store(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("local") / "store"
    run(out, tokenizer_dir, "local")
    return out


def split_sample(directory: Path, cuts: tuple[int, ...] = (30, 58)) -> list[Path]:
    """data/sample.txt as files of whole documents (cut after the given separators): the same stream."""
    data, sep = SAMPLE.read_bytes(), b"\n<|endoftext|>\n"
    ends, pos = [], 0
    while (pos := data.find(sep, pos)) >= 0:
        pos += len(sep)
        ends.append(pos)
    bounds = [0] + [ends[c - 1] for c in cuts] + [len(data)]
    parts = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        parts.append(directory / f"part-{i}.txt")
        parts[-1].write_bytes(data[a:b])
    return parts


@needs_ray
def test_cli_ray_engine_writes_the_local_store(ray_cluster, local_store, tokenizer_dir, tmp_path):
    """Three input files (the held-out documents span two of them) through `--engine ray`."""
    from click.testing import CliRunner

    from lmdata.cli.ingest import ingest_command
    from lmdata.store.verify import verify_store

    out = tmp_path / "ray"
    inputs = [a for p in split_sample(tmp_path) for a in ("--input", str(p))]
    args = inputs + ["--tokenizer", str(tokenizer_dir), "--out", str(out), "--holdout", "6",
                     "--shard-tokens", str(SHARD_TOKENS), "--engine", "ray", "--no-progress"]
    result = CliRunner().invoke(ingest_command, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    for store in (local_store, out):
        verify_store(store).raise_if_bad()
    ray_store, local = fingerprint(out), fingerprint(local_store)
    for split in [*ray_store["splits"].values(), *local["splits"].values()]:
        split.pop("sources")  # the same documents, from other file names:
        split.pop("provenance", None)  # so other (file, offset) origins too
    assert ray_store == local  # counts, cut points, every shard file's checksum
    for split in ("train", "validation"):
        for fmt in FORMATS:
            assert np.array_equal(stream(out, split, fmt), stream(local_store, split, "memmap"))


@needs_ray
def test_first_attempt_failures_are_retried(ray_cluster, faults, local_store, tokenizer_dir, tmp_path):
    """A worker killed while encoding, before a write and after a write: same store, no leftovers."""
    armed = ["encode-0-7", "write-parquet-00002", "wrote-lance-00004"]
    for key in armed:
        (faults / key).touch()
    out = tmp_path / "ray"
    run(out, tokenizer_dir, "ray")
    assert sorted(p.name for p in faults.iterdir()) == sorted(k + ".fired" for k in armed)
    assert fingerprint(out) == fingerprint(local_store)
    from lmdata.store.verify import verify_store

    verify_store(out).raise_if_bad()
    n_shards = len(fingerprint(out)["splits"]["train"]["formats"]["lance"]["shards"])
    assert len(list((out / "train" / "lance" / "data").iterdir())) == n_shards  # retried fragments removed
    assert not list(out.rglob(".*.tmp-*"))


@needs_ray
def test_ray_resumes_an_interrupted_local_ingest(ray_cluster, local_store, tokenizer_dir, tmp_path):
    """Completed shards are reused, the rest re-encoded from the right document on."""
    import shutil

    out = tmp_path / "store"
    shutil.copytree(local_store, out)
    (out / "manifest.json").unlink()  # an ingest that died before its manifest...
    for fmt in FORMATS:  # ...after completing shards 0-4 of train in every format
        for rec in (out / "train" / fmt / "_shards").glob("*.json"):
            if int(rec.stem) >= 5:
                rec.unlink()
    run(out, tokenizer_dir, "ray", resume=True)
    assert fingerprint(out) == fingerprint(local_store)


@needs_ray
def test_bad_input_names_the_file_like_the_local_engine(ray_cluster, tokenizer_dir, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n<|endoftext|>\n" + b"x" * 100 + b"\xff\xfe broken\n")
    messages = []
    for engine in ("local", "ray"):
        with pytest.raises(LmdataError) as err:
            ingest({"train": SourceSpec((str(bad),))}, tokenizer_dir, tmp_path / engine, formats=FORMATS,
                   workers=1, progress=False, log=None, engine=engine)
        assert not (tmp_path / engine).exists()  # a fresh store is removed again: the fixed input just reruns
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert str(bad) in messages[1] and "byte 119" in messages[1]

    bad.write_bytes(b"\n<|endoftext|>\n".join([b"one", b"t\xffwo", b"three", b"fo\xfeur"]))
    for engine in ("local", "ray"):  # --errors replace: the same counts of U+FFFD per split
        ingest({"train": SourceSpec((str(bad),), errors="replace")}, tokenizer_dir, tmp_path / f"r-{engine}",
               formats=FORMATS, workers=1, holdout=("train", "validation", 2), progress=False, log=None,
               engine=engine)
    assert fingerprint(tmp_path / "r-ray") == fingerprint(tmp_path / "r-local")
    assert fingerprint(tmp_path / "r-ray")["extra"]["splits"]["train"]["replaced"] == 1


@needs_ray
def test_a_lone_surrogate_is_one_line_like_the_local_engine(ray_cluster, tokenizer_dir, tmp_path):
    """Issue 19: JSON's "\\ud800" is half a character; the Ray engine met it as a UnicodeEncodeError
    traceback (Arrow cannot hold it). Both engines refuse it in the source, naming line and field."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "half \\ud800 a pair"}\n{"text": "ok"}\n')
    messages = []
    for engine in ("local", "ray"):
        with pytest.raises(LmdataError) as err:
            ingest({"train": SourceSpec((str(bad),), kind="jsonl")}, tokenizer_dir, tmp_path / engine,
                   formats=["memmap"], workers=1, progress=False, log=None, engine=engine)
        messages.append(str(err.value))
        assert not (tmp_path / engine).exists()
    assert messages[0] == messages[1]
    assert f"{bad}:2: field 'text': lone UTF-16 surrogate" in messages[0] and "--errors replace" in messages[0]
    for engine in ("local", "ray"):  # --errors replace: U+FFFD, counted, the same store
        ingest({"train": SourceSpec((str(bad),), kind="jsonl", errors="replace")}, tokenizer_dir,
               tmp_path / f"r-{engine}", formats=FORMATS, workers=1, progress=False, log=None, engine=engine)
    assert fingerprint(tmp_path / "r-ray") == fingerprint(tmp_path / "r-local")
    assert fingerprint(tmp_path / "r-ray")["extra"]["splits"]["train"]["replaced"] == 1


@needs_ray
def test_a_full_disk_is_one_resumable_line_like_the_local_engine(ray_cluster, tokenizer_dir, small_fs):
    """Issue 19, case 3, on the Ray engine: the NoSpaceError of a shard write reaches the user as
    the same one line (path, bytes, --resume), and no manifest is written."""
    fs = small_fs("600k")
    with pytest.raises(LmdataError) as err:
        ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, fs / "store", formats=["memmap"],
               shard_tokens=SHARD_TOKENS, workers=2, progress=False, log=None, engine="ray")
    text = str(err.value)
    assert "\n" not in text and "no space left on device (writing about" in text and "--resume" in text
    assert not (fs / "store" / "manifest.json").exists()


def test_without_ray_the_engine_says_how_to_install(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from lmdata.ingest.ray import require_ray\n"
        "try:\n    require_ray()\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("LmdataError") and "pip install 'lmdata[ray]'" in out


def test_a_short_committed_fragment_is_caught_before_the_manifest(local_store, tmp_path):
    """The Lance-on-Ray retry failure (a fragment committed with fewer rows, no error) is refused."""
    import shutil

    import lance
    from lance.fragment import LanceFragment

    from lmdata.ingest.ray import check_committed
    from lmdata.store.formats.lance import LanceWriter
    from lmdata.store.formats.lance_fragments import STORAGE_VERSION
    from lmdata.store.manifest import read_manifest

    out = tmp_path / "store"
    shutil.copytree(local_store, out)
    manifest = read_manifest(out)
    shards = manifest.splits["train"].formats["lance"]  # fragments, each a run of ingest shards
    memmap = out / "train" / "memmap"
    last_docs = {s.first_doc + s.n_docs - 1: int(np.diff(np.load(memmap / f"docs-{s.name}.npy"))[-1])
                 for s in manifest.splits["train"].formats["memmap"]}
    lance_dir = out / "train" / "lance"
    writer = LanceWriter(lance_dir, np.dtype(manifest.dtype))
    check_committed("lance", writer, shards, last_docs, manifest.dtype, manifest.eot_id)  # intact: passes

    ds = lance.dataset(str(lance_dir))
    frags = [f.metadata for f in ds.get_fragments()]
    table = ds.get_fragments()[-1].to_table()
    frags[-1] = LanceFragment.create(str(lance_dir), table.slice(0, table.num_rows - 1), fragment_id=frags[-1].id,
                                     schema=ds.schema, data_storage_version=STORAGE_VERSION)
    lance.LanceDataset.commit(str(lance_dir), lance.LanceOperation.Overwrite(ds.schema, frags))
    with pytest.raises(LmdataError, match="rows|not the manifest"):
        check_committed("lance", writer, shards, last_docs, manifest.dtype, manifest.eot_id)


def test_an_address_without_ray_fails_fast(monkeypatch):
    import socket

    from lmdata.ingest.ray import _check_address

    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(LmdataError, match=f"--ray-address 127.0.0.1:{port}: no Ray there"):
        _check_address(f"127.0.0.1:{port}")
    services = pytest.importorskip("ray._private.services")
    # auto: what Ray resolves it to is probed too (a stale cluster file's address had hung the ingest for good)
    monkeypatch.setattr(services, "canonicalize_bootstrap_address", lambda addr, temp_dir=None: f"127.0.0.1:{port}")
    with pytest.raises(LmdataError, match=rf"--ray-address auto \(Ray resolves it to 127.0.0.1:{port}\): no Ray there"):
        _check_address("auto")

    def nothing_running(addr, temp_dir=None):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(services, "canonicalize_bootstrap_address", nothing_running)
    with pytest.raises(LmdataError, match="--ray-address auto: no Ray is running on this machine"):
        _check_address("auto")
    for resolved in (None, "ray://head:10001"):  # RAY_ADDRESS=local, a Ray Client address: left to ray.init
        monkeypatch.setattr(services, "canonicalize_bootstrap_address", lambda addr, temp_dir=None: resolved)
        _check_address("auto")

    def client_address(addr, temp_dir=None):
        raise ValueError("Invalid address format")  # what Ray says of RAY_ADDRESS=ray://... here

    monkeypatch.setattr(services, "canonicalize_bootstrap_address", client_address)
    _check_address("auto")


@needs_ray
def test_a_bad_ray_address_leaves_nothing_behind(tokenizer_dir, tmp_path):
    """Ray connects before the store is touched (a subprocess: this module's Ray is already initialized)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "new" / "store"
    proc = subprocess.run([sys.executable, "-m", "lmdata", "ingest", "--input", str(SAMPLE), "--tokenizer",
                           str(tokenizer_dir), "--out", str(out), "--engine", "ray", "--ray-address",
                           f"127.0.0.1:{port}", "--no-progress"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and f"--ray-address 127.0.0.1:{port}: no Ray there" in proc.stderr, proc.stderr
    assert not (tmp_path / "new").exists()


@needs_ray
def test_a_killed_ray_ingest_resumes_to_the_same_store(ray_cluster, local_store, tokenizer_dir, tmp_path):
    """SIGKILL the driver (another process on the same Ray) mid-split: no manifest; --resume finishes it."""
    import signal
    import time

    out = tmp_path / "store"
    script = (
        "import ray, lmdata.ingest as li\n"
        "from lmdata.sources import SourceSpec\n"
        "li.BATCH_BYTES = 1 << 14\n"
        f"ray.init(address={ray_cluster.get_runtime_context().gcs_address!r}, log_to_driver=False)\n"
        f"li.ingest({{'train': SourceSpec(({str(SAMPLE)!r},))}}, {str(tokenizer_dir)!r}, {str(out)!r}, "
        f"formats={FORMATS!r}, shard_tokens={SHARD_TOKENS}, holdout={HOLDOUT!r}, progress=False, log=None, "
        "engine='ray')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    record = out / "train" / "lance" / "_shards" / "00003.json"
    deadline = time.monotonic() + 60
    while not record.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert record.exists() and not (out / "manifest.json").exists()
    run(out, tokenizer_dir, "ray", resume=True)
    assert fingerprint(out) == fingerprint(local_store)


def test_pipeline_toml_chooses_the_engine():
    from lmdata.config import parse_pipeline

    table = {"ingest": {"out": "s", "engine": "ray", "ray_address": "auto", "splits": {"train": {"sources": ["a"]}}}}
    cfg = parse_pipeline(table).ingest
    assert (cfg.engine, cfg.ray_address) == ("ray", "auto")
    assert parse_pipeline({"ingest": {"out": "s", "splits": {"train": {"sources": ["a"]}}}}).ingest.engine == "local"
    table["ingest"]["engine"] = "spark"
    with pytest.raises(LmdataError, match="engine"):
        parse_pipeline(table)


def test_ray_reads_s3_inputs_like_the_local_engine(ray_cluster, s3, tokenizer_dir, tmp_path):
    """Inputs on object storage: the Ray tasks open the objects themselves (issue 15)."""
    from lmdata.io.location import location

    location(s3.uri("in", "sample.txt")).write_bytes(SAMPLE.read_bytes())
    spec = {"train": SourceSpec((s3.uri("in", "*.txt"),))}
    for engine in ("local", "ray"):
        ingest(spec, tokenizer_dir, tmp_path / engine, formats=["memmap"], shard_tokens=SHARD_TOKENS, workers=2,
               holdout=HOLDOUT, progress=False, log=None, engine=engine)
    assert fingerprint(tmp_path / "ray") == fingerprint(tmp_path / "local")


def _descendants(pid: int) -> set[int]:
    found, stack = set(), [pid]
    while stack:
        p = stack.pop()
        try:
            kids = [int(c) for t in os.listdir(f"/proc/{p}/task") for c in open(f"/proc/{p}/task/{t}/children").read().split()]
        except OSError:
            kids = []
        stack += [k for k in kids if k not in found]
        found.update(kids)
    return found


@needs_ray
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the reaper walks /proc")
def test_a_sigkilled_driver_takes_its_private_ray_with_it(tokenizer_dir, tmp_path):
    """Issue 29: a killed ingest's Ray workers kept running (a task's worker ends only with its task)."""
    import signal
    import time

    script = (
        "import time, ray\n"
        "from lmdata.ingest.ray import RayEngine\n"
        f"engine = RayEngine({str(tokenizer_dir)!r}, workers=1)\n"
        "@ray.remote\n"
        f"def busy(): open({str(tmp_path / 'busy')!r}, 'w').close(); time.sleep(600)\n"
        "ref = busy.remote()\n"
        f"while not __import__('os').path.exists({str(tmp_path / 'busy')!r}): time.sleep(0.1)\n"
        "print('BUSY', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline()
        assert ready.strip() == "BUSY", ready
        ray_procs = _descendants(proc.pid)
        assert len(ray_procs) >= 3  # GCS, raylet, the busy worker, the reaper...
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 20  # a generous bound: without the reaper the worker lives 600 s
        alive = set(ray_procs)
        while alive and time.monotonic() < deadline:
            alive = {p for p in alive if os.path.exists(f"/proc/{p}") and
                     open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"}
            time.sleep(0.2)
        assert not alive, [open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:80] for p in alive]
    finally:
        proc.kill()
