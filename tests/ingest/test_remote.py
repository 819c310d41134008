"""A store on object storage (a real S3 server on loopback): ingest, verify, read, resume, refuse.

The sample goes to ``s3://`` once per module in every format; each test reads it back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from samples import FORMATS, HOLDOUT, SAMPLE, SAMPLE_SHARD_TOKENS

from lmdata.data import make_loader
from lmdata.errors import LmdataError
from lmdata.ingest import ingest
from lmdata.sources import SourceSpec
from lmdata.store import open_store, verify_store
from lmdata.io.location import location

N_BATCHES = 6


@pytest.fixture(scope="module")
def remote_sample(s3_server, s3_env, tokenizer_dir, tmp_path_factory):
    """(s3 URI of the sample store, its local twin) -- the AWS environment set for the module."""
    mp = pytest.MonkeyPatch()
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        mp.delenv(key)
    for key, value in s3_env.items():
        mp.setenv(key, value)
    mp.setenv("LMDATA_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    bucket = f"m-{uuid.uuid4().hex[:10]}"
    s3_server.make_bucket(bucket)
    uri = f"s3://{bucket}/stores/sample"
    kwargs = dict(formats=FORMATS, shard_tokens=SAMPLE_SHARD_TOKENS, workers=1,
                  holdout=("train", "validation", HOLDOUT), progress=False, log=None)
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, uri, **kwargs)
    local = tmp_path_factory.mktemp("twin") / "sample"
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, local, **kwargs)
    yield uri, local
    mp.undo()


def test_remote_store_verifies_and_matches_the_local_one(remote_sample):
    uri, local = remote_sample
    assert not any(p.startswith("s3:") for p in os.listdir("."))  # never a local directory named "s3:"
    report = verify_store(uri)
    assert report.ok, report.problems
    remote, here = open_store(uri), open_store(local)
    assert remote.manifest.to_json()["splits"]["train"]["n_tokens"] == here.manifest.splits["train"].n_tokens
    assert remote.tokenizer().hash == here.tokenizer().hash
    for fmt in FORMATS:
        assert np.array_equal(remote.document("validation", 2, fmt), here.document("validation", 2, fmt))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("fmt", FORMATS)
def test_first_batches_from_s3_equal_the_local_stores(remote_sample, fmt, workers):
    uri, local = remote_sample
    batches = []
    for where in (uri, local):
        ds = open_store(where).dataset("train", 64, fmt)
        loader = make_loader(ds, 8, num_workers=workers, seed=3, timeout=60)
        got = []
        for inputs, targets in loader:
            got.append((inputs.numpy().copy(), targets.numpy().copy()))
            if len(got) == N_BATCHES:
                break
        batches.append(got)
    for (xr, yr), (xl, yl) in zip(*batches):
        assert np.array_equal(xr, xl) and np.array_equal(yr, yl)


def _flip_object(uri: str, at: float = 0.5) -> None:
    obj = location(uri)
    data = bytearray(obj.read_bytes())
    data[int(len(data) * at)] ^= 0x10
    obj.write_bytes(bytes(data))


def _flip_pattern(uri: str, pattern: bytes, at: int) -> None:
    """Flip byte ``at`` of every occurrence of ``pattern`` in the object."""
    obj = location(uri)
    data = bytearray(obj.read_bytes())
    found, i = [], data.find(pattern)
    while i >= 0:
        found.append(i)
        i = data.find(pattern, i + 1)
    assert found, "pattern not in the object"
    for i in found:
        data[i + at] ^= 0x10
    obj.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_corrupted_object_is_refused_naming_it(s3, tokenizer_dir, tmp_path, monkeypatch, fmt):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    # Lance: no decoded copies, which the clean read below would make of the sound rows and which
    # would then serve them (a damaged row is never copied: tests/store/test_lance_remote.py)
    monkeypatch.setenv("LMDATA_LANCE_CACHE_BYTES", "0")
    uri = s3.uri("flip")
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, uri, formats=[fmt], shard_tokens=60_000,
           workers=1, progress=False, log=None)
    store = open_store(uri)
    shards = store.manifest.splits["train"].formats[fmt]
    shard = shards[min(1, len(shards) - 1)]  # Lance: the shards are one fragment
    flipped = shard.first_token + shard.n_tokens // 2
    obj = f"{uri}/train/{fmt}/{shard.files[0].path}"
    if fmt == "lance":  # damage the rows holding these tokens (the object has no other checksum)
        clean = store.reader("train", fmt).windows(np.array([flipped - 8]), 16)[0]
        _flip_pattern(obj, clean.astype("<u2").tobytes(), 16)
    else:
        _flip_object(obj)
    r = open_store(uri).reader("train", fmt)
    with pytest.raises(LmdataError, match=f"{shard.files[0].path}.*shard {shard.name}"):
        r.windows(np.arange(flipped - 3000, flipped + 1, 500), 1000)
    assert not verify_store(uri).ok


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_missing_object_is_named_when_read_not_listed_at_open(s3, tokenizer_dir, tmp_path, monkeypatch, fmt):
    """open_store lists nothing (a LIST pages 1,000 keys a request): the reader names the object it misses."""
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    uri = s3.uri("gone")
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, uri, formats=[fmt], shard_tokens=60_000,
           workers=1, progress=False, log=None)
    shard = open_store(uri).manifest.splits["train"].formats[fmt][0]
    location(f"{uri}/train/{fmt}/{shard.files[0].path}").delete()
    listed = []
    monkeypatch.setattr(type(location(uri)), "list", lambda self, recursive=False: listed.append(self) or [])
    r = open_store(uri).reader("train", fmt)
    assert not listed
    with pytest.raises(LmdataError, match=f"{shard.files[0].path}.*(no such object|Not found).*damaged .*verify"):
        r.windows(np.array([shard.first_token]), 100)


def test_unknown_scheme_and_missing_bucket_are_one_line_errors(s3, tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LmdataError, match="unknown URI scheme"):
        ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, "gs://bucket/store", progress=False, log=None)
    assert list(tmp_path.iterdir()) == []
    for call in (lambda: open_store(f"s3://{s3.bucket}-nope/store"),
                 lambda: ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, f"s3://{s3.bucket}-nope/x",
                                progress=False, log=None)):
        with pytest.raises(LmdataError, match="bucket does not exist") as err:
            call()
        assert "\n" not in str(err.value)
    with pytest.raises(LmdataError, match="not a store"):
        open_store(s3.uri("empty"))


def test_overwrite_on_s3_deletes_only_objects_of_our_layout(s3, tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    spec, opts = {"train": SourceSpec((str(SAMPLE),))}, dict(formats=["memmap"], workers=1, progress=False, log=None)
    user = location(s3.uri("theirs", "notes.txt"))
    user.write_bytes(b"a user's object")
    with pytest.raises(LmdataError, match="no lmdata store") as err:
        ingest(spec, tokenizer_dir, s3.uri("theirs"), overwrite=True, **opts)
    assert "\n" not in str(err.value) and user.read_bytes() == b"a user's object"
    uri = s3.uri("ours")
    ingest(spec, tokenizer_dir, uri, **opts)
    stray = location(uri + "/train/memmap/README.md")
    stray.write_bytes(b"mine")
    with pytest.raises(LmdataError, match="did not write.*train/memmap/README.md"):
        ingest(spec, tokenizer_dir, uri, overwrite=True, **opts)
    assert stray.read_bytes() == b"mine"
    stray.delete()
    ingest(spec, tokenizer_dir, uri, overwrite=True, **opts)
    assert verify_store(uri).ok


def test_inspect_sql_and_show_read_a_remote_store(remote_sample):
    from lmdata.inspect import inspect, show, sql

    uri, local = remote_sample
    remote, here = inspect(uri), inspect(local)
    assert remote["splits"]["train"]["doc_tokens"] == here["splits"]["train"]["doc_tokens"]
    assert remote["splits"]["train"]["formats"]["memmap"]["bytes"] > 0
    query = "SELECT count(*), sum(n_tokens) FROM docs WHERE split = 'train'"
    assert sql(uri, query) == sql(local, query)
    rows = "SELECT count(*), sum(len(tokens)) FROM tokens WHERE split = 'validation'"
    assert sql(uri, rows) == sql(local, rows)
    assert show(uri, "validation", 1) == show(local, "validation", 1)


def _objects(uri: str) -> dict[str, bytes]:
    root = location(uri)
    return {x.key: x.loc.read_bytes() for x in root.list(recursive=True)}


def test_kill_9_during_a_remote_ingest_then_resume_gives_identical_objects(s3, tokenizer_dir, tmp_path, monkeypatch):
    from samples import fingerprint

    from lmdata.ingest.publish import staging_dir

    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    spec, opts = {"train": SourceSpec((str(SAMPLE),))}, dict(formats=["memmap", "parquet"], shard_tokens=5_000,
                                                             workers=1, progress=False, log=None)
    uri = s3.uri("resumed")
    code = (f"from lmdata.ingest import ingest; from lmdata.sources import SourceSpec; "
            f"ingest({{'train': SourceSpec(({str(SAMPLE)!r},))}}, {str(tokenizer_dir)!r}, {uri!r}, "
            f"formats=['memmap', 'parquet'], shard_tokens=5_000, workers=1, progress=False, log=None)")
    proc = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ))
    records = staging_dir(location(uri)) / "train" / "parquet" / "_shards"
    deadline = time.monotonic() + 120
    plan = staging_dir(location(uri)) / "ingest-plan.json"
    while proc.poll() is None and time.monotonic() < deadline and (
            len(list(records.glob("*.json"))) < 3 or '"xxh128": null' in (plan.read_text() if plan.exists() else "null")):
        time.sleep(0.05)  # (resumable once the plan holds the input's checksum)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the ingest finished before it could be killed"
    with pytest.raises(LmdataError, match="not a store"):
        open_store(uri)  # no manifest yet: never a half store
    ingest(spec, tokenizer_dir, uri, resume=True, **opts)
    ingest(spec, tokenizer_dir, s3.uri("straight"), **opts)
    resumed, straight = _objects(uri), _objects(s3.uri("straight"))
    assert sorted(resumed) == sorted(straight)
    for name in resumed:
        if name != "manifest.json":
            assert resumed[name] == straight[name], name
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    (tmp_path / "a" / "manifest.json").write_bytes(resumed["manifest.json"])
    (tmp_path / "b" / "manifest.json").write_bytes(straight["manifest.json"])
    assert fingerprint(tmp_path / "a") == fingerprint(tmp_path / "b")
    assert verify_store(uri).ok


def test_resume_on_a_finished_store_ingests_and_uploads_nothing(remote_sample, tokenizer_dir, monkeypatch):
    from lmdata.ingest import publish
    from lmdata.io.location import Location

    uri, _ = remote_sample
    before = _objects(uri)

    def refuse(*args, **kwargs):
        raise AssertionError("nothing should be uploaded or tokenized")

    monkeypatch.setattr(Location, "upload", refuse)
    monkeypatch.setattr(Location, "write_bytes", refuse)
    spec = {"train": SourceSpec((str(SAMPLE),))}
    kwargs = dict(formats=FORMATS, shard_tokens=SAMPLE_SHARD_TOKENS, workers=1,
                  holdout=("train", "validation", HOLDOUT), progress=False)
    lines: list[str] = []
    assert ingest(spec, tokenizer_dir, uri, resume=True, log=lines.append, **kwargs) is None
    assert lines == [f"{uri} already holds this finished store; nothing to ingest or upload"]
    assert not publish.staging_dir(location(uri)).exists()
    assert _objects(uri) == before
    with pytest.raises(LmdataError, match=r"was started with different settings \(--shard-tokens was 30000, now 4000"):
        ingest(spec, tokenizer_dir, uri, resume=True, log=None, **{**kwargs, "shard_tokens": 4000})
    with pytest.raises(LmdataError, match=r"different settings \(--format was"):
        ingest(spec, tokenizer_dir, uri, resume=True, log=None, **{**kwargs, "formats": ["memmap"]})
    with pytest.raises(LmdataError, match=r"unknown format 'feather'"):  # its own error, not "different settings"
        ingest(spec, tokenizer_dir, uri, resume=True, log=None, **{**kwargs, "formats": ["memmap", "feather"]})
    assert _objects(uri) == before
    assert verify_store(uri).ok


_APPEND = """
import sys, lance, pyarrow as pa
from lmdata.io.location import location
loc, start = location(sys.argv[1]), int(sys.argv[2])
for k in range(4):
    rows = pa.table({"x": pa.array(range(start + 10 * k, start + 10 * k + 10), pa.int64())})
    lance.write_dataset(rows, loc.uri, mode="append", storage_options=loc.storage_options())
"""


def test_two_concurrent_lance_appends_lose_nothing(s3):
    """Lance commits with a conditional PUT (If-None-Match: *): the loser of a race retries, never overwrites."""
    import lance
    import pyarrow as pa

    loc = location(s3.uri("race.lance"))
    lance.write_dataset(pa.table({"x": pa.array([-1], pa.int64())}), loc.uri, storage_options=loc.storage_options())
    procs = [subprocess.Popen([sys.executable, "-c", _APPEND, loc.uri, str(start)], env=dict(os.environ))
             for start in (0, 1000)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    ds = lance.dataset(loc.uri, storage_options=loc.storage_options())
    got = sorted(ds.to_table().column("x").to_pylist())
    assert got == [-1] + list(range(0, 40)) + list(range(1000, 1040))
    assert ds.version == 9  # one commit per append, none lost


def test_cli_commands_take_s3_uris(remote_sample):
    from click.testing import CliRunner

    from lmdata.cli import cli

    uri, _ = remote_sample
    runner = CliRunner()
    for args in (["verify", uri], ["inspect", uri], ["show", uri, "--split", "validation", "--doc", "1"],
                 ["sql", uri, "SELECT count(*) FROM docs"]):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, (args, result.output)
    result = runner.invoke(cli, ["verify", "gs://bucket/store"])
    assert isinstance(result.exception, LmdataError) and "unknown URI scheme" in str(result.exception)


def test_inputs_from_s3_objects_and_globs(s3, sample_store, tokenizer_dir, tmp_path, monkeypatch):
    import gzip

    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    text = SAMPLE.read_bytes()
    half = text.index(b"<|endoftext|>", len(text) // 2) + len(b"<|endoftext|>\n")
    s3.put("in/a.txt", text[:half])  # boto3, as `aws s3 cp` uploads: the bytes as given
    s3.put("in/sub/b.txt.gz", gzip.compress(text[half:]))
    s3.put("in/notes.md", b"not matched")
    out = tmp_path / "from-s3"
    ingest({"train": SourceSpec((s3.uri("in", "**", "*.txt*"),))}, tokenizer_dir, out, formats=["memmap"],
           workers=1, progress=False, log=None)
    local = tmp_path / "from-disk"
    (tmp_path / "a.txt").write_bytes(text[:half]), (tmp_path / "b.txt.gz").write_bytes(gzip.compress(text[half:]))
    ingest({"train": SourceSpec((str(tmp_path / "a.txt"), str(tmp_path / "b.txt.gz")))}, tokenizer_dir, local,
           formats=["memmap"], workers=1, progress=False, log=None)
    a, b = open_store(out).reader("train", "memmap"), open_store(local).reader("train", "memmap")
    assert a.n_tokens == b.n_tokens
    np.testing.assert_array_equal(a.windows(np.array([0]), a.n_tokens), b.windows(np.array([0]), b.n_tokens))
    plan = (out / "ingest-plan.json").read_text()
    assert s3.uri("in", "a.txt") in plan and s3.uri("in", "sub", "b.txt.gz") in plan
    no_bucket = "s3://no-such-bucket-lmdata/in/a.txt"
    for missing, match in ((s3.uri("in", "nope.txt"), "no such object"), (s3.uri("in", "*.json"), "matches no objects"),
                           (no_bucket, "no-such-bucket-lmdata.*the bucket does not exist")):
        with pytest.raises(LmdataError, match=match):
            ingest({"train": SourceSpec((missing,))}, tokenizer_dir, tmp_path / "x", progress=False, log=None)


def test_lmdata_bench_reads_an_s3_store(remote_sample, tmp_path):
    import json

    from click.testing import CliRunner

    from lmdata.cli import cli

    uri, _ = remote_sample
    out = tmp_path / "bench"
    result = CliRunner().invoke(cli, ["bench", "--store", uri, "--format", "memmap,parquet,lance", "--loader-workers", "0",
                                      "--steps", "3", "--batch-size", "4", "--seq-len", "64", "--step-ms", "1",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "bench.json").read_text())
    assert report["config"]["store"] == uri  # the URI, never folded into a local 's3:' directory
    assert not (tmp_path / "s3:").exists()
    assert sorted({row["format"] for row in report["runs"]}) == ["lance", "memmap", "parquet"]
    cold = CliRunner().invoke(cli, ["bench", "--store", uri, "--format", "memmap", "--cache", "cold", "--step-ms", "1",
                                    "--steps", "3", "--batch-size", "4", "--seq-len", "64"])
    assert cold.exit_code == 1 and "--cache cold: " in str(cold.exception) and "object storage" in str(cold.exception)


def test_a_parquet_input_object_is_read_by_random_access(s3, tokenizer_dir, tmp_path, monkeypatch):
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    docs = [d for d in SAMPLE.read_text().split("<|endoftext|>\n") if d.strip()][:40]
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": docs}), buf, row_group_size=8)
    location(s3.uri("in", "docs.parquet")).write_bytes(buf.getvalue())
    ingest({"train": SourceSpec((s3.uri("in", "docs.parquet"),))}, tokenizer_dir, tmp_path / "store",
           formats=["memmap"], workers=1, progress=False, log=None)
    assert open_store(tmp_path / "store").manifest.splits["train"].n_docs == len(docs)


def _stop_the_upload_after(monkeypatch, n: int) -> None:
    """The next upload stops (Ctrl-C) after ``n`` objects: the staging holds a whole store, the prefix part of it."""
    from lmdata.io.location import Location

    sent, real = [], Location.upload

    def upload(self, path):
        if len(sent) >= n:
            raise KeyboardInterrupt
        sent.append(self.uri)
        return real(self, path)

    monkeypatch.setattr(Location, "upload", upload)


def test_a_resume_after_the_upload_stopped_refuses_changed_inputs_on_this_machine_and_another(
        s3, tokenizer_dir, tmp_path, monkeypatch):
    """--resume with the staging whole had uploaded it unchecked (another input, another --shard-tokens), and on
    another machine (no staging) had ingested anew and skipped the objects of the same name and size: exit 0
    on a store that failed verify. Both now compare the plan; the same arguments finish the store."""
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache-a"))
    changed = tmp_path / "changed.txt"
    changed.write_text(SAMPLE.read_text(encoding="utf-8") + "\none more line\n", encoding="utf-8")
    opts = dict(formats=["memmap", "parquet"], shard_tokens=5_000, workers=1, progress=False, log=None)
    spec, other = {"train": SourceSpec((str(SAMPLE),))}, {"train": SourceSpec((str(changed),))}
    uri = s3.uri("stopped")
    with monkeypatch.context() as m:
        _stop_the_upload_after(m, 6)
        with pytest.raises(KeyboardInterrupt):
            ingest(spec, tokenizer_dir, uri, **opts)
    for cache in ("cache-a", "cache-b"):  # this machine (its staging is whole), then another (none)
        monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / cache))
        with pytest.raises(LmdataError, match=rf"^{uri} was started with different settings \(split 'train': its inputs were"):
            ingest(other, tokenizer_dir, uri, resume=True, **opts)
        with pytest.raises(LmdataError, match=r"different settings \(--shard-tokens was 5000, now 6000"):
            ingest(spec, tokenizer_dir, uri, resume=True, **{**opts, "shard_tokens": 6000})
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache-a"))
    s3.put("stopped/train/memmap/tokens-09999.bin", b"an earlier run's")  # a name our layout has, no manifest's
    lines: list[str] = []
    from lmdata.ingest import job

    planned, real_plan = [], job.requested_plan
    monkeypatch.setattr(job, "requested_plan", lambda *a, **k: planned.append(1) or real_plan(*a, **k))
    ingest(spec, tokenizer_dir, uri, resume=True, **{**opts, "log": lines.append})
    assert len(planned) == 1  # the inputs hashed once (twice before: the prefix's plan, then the staging's)
    assert verify_store(uri).ok
    assert "train/memmap/tokens-09999.bin" not in _objects(uri) and "deleted 1 left by an earlier run" in lines[-1]
    with pytest.raises(LmdataError, match="different settings"):  # finished, with another staging left elsewhere
        ingest(other, tokenizer_dir, uri, resume=True, **opts)


def test_a_second_ingest_to_the_same_uri_on_this_machine_is_refused_at_once(s3, tokenizer_dir, tmp_path, monkeypatch):
    """It had deleted the first one's staging directory before taking any lock: both failed."""
    from filelock import FileLock

    from lmdata.ingest.publish import staging_dir

    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    uri = s3.uri("busy")
    staging = staging_dir(location(uri))
    staging.mkdir(parents=True)
    (staging / "marker").write_text("the first ingest's")
    held = FileLock(str(staging.with_name(staging.name + ".lock")), timeout=0)
    held.acquire()
    try:
        with pytest.raises(LmdataError, match=rf"^--out {uri}: another ingest on this machine is writing this store"):
            ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, uri, formats=["memmap"], workers=1,
                   progress=False, log=None)
        assert (staging / "marker").exists()
    finally:
        held.release()


def test_a_damaged_remote_tokenizer_is_named_by_its_uri_not_the_cache(s3, tokenizer_dir, tmp_path, monkeypatch):
    """show/verify had named the local cache's copy (~/.cache/lmdata/tokenizers/...), and said to train it again."""
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    uri = s3.uri("tok-gone")
    ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, uri, formats=["memmap"], workers=1,
           progress=False, log=None)
    location(f"{uri}/tokenizer/merges.txt").delete()
    with pytest.raises(LmdataError, match=rf"^{uri}/tokenizer/merges.txt: missing; the store's tokenizer is damaged "
                                          r"\(re-ingest with --overwrite\)$"):
        open_store(uri).tokenizer()


def test_a_missing_input_leaves_the_prefix_untouched(s3, tokenizer_dir, tmp_path, monkeypatch):
    """The write probe ran before the inputs were looked at, and left a 0-byte "prefix/" marker behind."""
    monkeypatch.setenv("LMDATA_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(LmdataError, match="no such file"):
        ingest({"train": SourceSpec((str(tmp_path / "nope.txt"),))}, tokenizer_dir, s3.uri("refused"),
               progress=False, log=None)
    assert s3.client().list_objects_v2(Bucket=s3.bucket).get("KeyCount") == 0  # (raw keys: markers too)
    s3.put("other/foo.txt", b"a user's object")
    with pytest.raises(LmdataError, match=rf"^--out {s3.uri('other/foo.txt')}: is an object, not a prefix"):
        ingest({"train": SourceSpec((str(SAMPLE),))}, tokenizer_dir, s3.uri("other/foo.txt"), progress=False, log=None)
