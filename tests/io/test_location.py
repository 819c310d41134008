"""Locations: local paths vs s3:// URIs, the AWS environment, and one-line errors against a real server."""

from __future__ import annotations

import os
import pickle

import pytest

from lmdata.errors import LmdataError
from lmdata.io.location import Location, glob, location
from lmdata.io.s3 import lance_storage_options, s3_filesystem


def test_local_paths_and_file_uris_are_local(tmp_path):
    assert location(str(tmp_path)).local_path == tmp_path
    assert location(tmp_path).local_path == tmp_path
    assert location(f"file://{tmp_path}").local_path == tmp_path
    assert not location("runs/store").remote


@pytest.mark.parametrize("uri", ["gs://bucket/x", "http://host/x", "hdfs://nn/x", "S4://b/x"])
def test_unknown_scheme_is_one_line_error_naming_it(uri, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LmdataError, match="unknown URI scheme") as err:
        location(uri, flag="--out")
    assert "\n" not in str(err.value) and "--out" in str(err.value)
    assert list(tmp_path.iterdir()) == []  # never a local directory named after the scheme


def test_s3_uri_joins_and_pickles_small():
    loc = location("s3://bucket//runs/store/")
    assert loc == Location("s3", "bucket/runs/store") and loc.bucket == "bucket"
    sub = loc / "train" / "memmap"
    assert sub.uri == "s3://bucket/runs/store/train/memmap" and sub.parent.uri == "s3://bucket/runs/store/train"
    assert pickle.loads(pickle.dumps(sub)) == sub and len(pickle.dumps(sub)) < 600
    for no_bucket in ("s3://", "s3:///x"):  # (s3:///x had been bucket "x": "the bucket does not exist")
        with pytest.raises(LmdataError, match="no bucket"):
            location(no_bucket)


def test_environment_becomes_pyarrow_and_lance_settings(monkeypatch):
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    opts = lance_storage_options()
    assert opts["aws_endpoint"] == "http://127.0.0.1:9" and opts["allow_http"] == "true"
    assert (opts["aws_access_key_id"], opts["aws_secret_access_key"], opts["aws_region"]) == ("key", "secret",
                                                                                               "eu-west-1")
    fs = s3_filesystem()
    assert fs.region == "eu-west-1" and s3_filesystem() is fs  # memoized per process and environment
    monkeypatch.setenv("AWS_ENDPOINT_URL", "ftp://x")
    with pytest.raises(LmdataError, match="AWS_ENDPOINT_URL"):
        lance_storage_options()


def test_objects_round_trip_list_and_glob(s3):
    root = location(s3.uri("data"))
    (root / "a.txt").write_bytes(b"alpha")
    (root / "sub" / "b.txt").write_bytes(b"beta")
    (root / "sub" / "c.json").write_bytes(b"{}")
    assert (root / "a.txt").read_bytes() == b"alpha" and (root / "a.txt").size() == 5
    assert (root / "nope").size() is None and not (root / "nope").exists()
    with pytest.raises(FileNotFoundError):
        (root / "nope").read_bytes()
    assert [(x.key, x.size) for x in root.list(recursive=True)] == [("a.txt", 5), ("sub/b.txt", 4), ("sub/c.json", 2)]
    assert [x.name for x in glob(s3.uri("data", "*.txt"))] == ["a.txt"]
    assert [x.name for x in glob(s3.uri("data", "**", "*.txt"))] == ["a.txt", "b.txt"]
    assert glob(s3.uri("data", "sub", "b.txt")) == [root / "sub" / "b.txt"]
    f = (root / "sub" / "b.txt").open_input()
    assert f.read_at(2, 1) == b"et"


def test_missing_bucket_is_one_line_error(s3):
    with pytest.raises(LmdataError, match="bucket does not exist") as err:
        location(f"s3://{s3.bucket}-absent/x").write_bytes(b"x")
    assert "\n" not in str(err.value) and f"s3://{s3.bucket}-absent/x" in str(err.value)


def test_unreachable_endpoint_fails_fast(s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    with pytest.raises(LmdataError, match="cannot reach 127.0.0.1:1") as err:
        location(s3.uri("x")).read_bytes()
    assert "\n" not in str(err.value)


def test_wrong_credentials_are_one_line_error(s3, s3_auth_server, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_auth_server.endpoint)
    for op in (lambda loc: loc.read_bytes(), lambda loc: loc.write_bytes(b"x")):
        with pytest.raises(LmdataError, match="access denied") as err:
            op(location(s3.uri("store", "manifest.json")))
        assert "\n" not in str(err.value) and "manifest.json" in str(err.value)


def test_a_local_location_answers_like_a_remote_one(tmp_path):
    root = location(f"file://{tmp_path}/data")
    assert root == location(tmp_path / "data") and not root.remote
    (root / "sub" / "b.txt").write_bytes(b"beta")
    (root / "a.txt").write_bytes(b"alpha")
    assert (root / "a.txt").read_bytes() == b"alpha" and (root / "a.txt").size() == 5
    assert (root / "nope").size() is None and not (root / "nope").exists() and root.exists()
    assert [(x.key, x.size) for x in root.list(recursive=True)] == [("a.txt", 5), ("sub/b.txt", 4)]
    with (root / "a.txt").open_stream() as fh:
        assert fh.read() == b"alpha"
    assert (root / "sub" / "b.txt").open_input().read_at(2, 1) == b"et"
    (root / "a.txt").delete()
    (root / "a.txt").delete()  # absent: nothing to do
    assert not (root / "a.txt").exists()


@pytest.mark.parametrize("typo", ["s3:/bucket/x", "s3:bucket", "file:/tmp/x"])
def test_a_uri_with_a_slash_missing_is_refused_not_made_a_directory(typo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LmdataError, match="slash missing") as err:
        location(typo, flag="--out")
    assert "--out" in str(err.value) and not any(tmp_path.iterdir())


def test_compressed_names_are_stored_and_read_as_given(s3):
    """pyarrow compresses and decompresses by extension unless told not to: lmdata never lets it."""
    import gzip

    data = gzip.compress(b"hello\n")
    loc = location(s3.uri("t.txt.gz"))
    loc.write_bytes(data)
    assert loc.size() == len(data) and loc.read_bytes() == data
    with loc.open_stream() as fh:
        assert fh.read() == data


def test_a_whole_object_is_read_with_one_get_not_a_stream_of_them(s3, monkeypatch):
    """A 3 MB object uploaded with boto3 (a Lance row index, a store's manifest): a HEAD and one GET.
    Read as a stream, pyarrow GETs 256 KiB at a time, one after another: 12 round trips here."""
    from lmdata.bench.delay_proxy import DelayProxy

    data = os.urandom(3 << 20)
    uri = s3.put("big/index.npy", data)
    empty = s3.put("big/empty", b"")
    with DelayProxy(s3.server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        assert location(uri).read_bytes() == data
        assert proxy.requests == 2
        assert location(empty).read_bytes() == b""


@pytest.mark.parametrize("bucket,key", [("t-0396d9b11403", "stores/train/shard-00002.parquet"),
                                        ("data", "runs/forbidden-credentials/403.bin")])
def test_a_timeout_on_an_object_whose_name_holds_403_is_a_timeout_not_access_denied(bucket, key):
    """pyarrow quotes the bucket and key in its messages: a random test bucket ``t-...403`` made a frozen
    endpoint's timeout read "access denied" (a CI failure, 1 run in ~5)."""
    from lmdata.io.s3 import EndpointError, remote_error

    raw = OSError(f"When reading information for key '{key}' in bucket '{bucket}': AWS Error NETWORK_CONNECTION "
                  "during HeadObject operation: curlCode: 28, Timeout was reached")
    err = remote_error(raw, f"s3://{bucket}/{key}")
    assert isinstance(err, EndpointError) and "no answer" in str(err), str(err)
    denied = OSError(f"When reading information for key '{key}' in bucket '{bucket}': AWS Error UNKNOWN "
                     "(HTTP status 403) during HeadObject operation: No response body.")
    assert "access denied" in str(remote_error(denied, f"s3://{bucket}/{key}"))


@pytest.mark.parametrize("uri", ["s3://nobucket/e", "s3://nobucket/s", "s3://nobucket/o/n"])
def test_a_short_name_in_the_uri_leaves_the_librarys_words_alone(uri, monkeypatch):
    """Every occurrence of a name had been taken out: a key "s" turned NoSuchBucket into NoSuchBucket's remains."""
    from lmdata.io.s3 import EndpointError, remote_error

    missing = OSError("When getting information for bucket 'nobucket': AWS Error NO_SUCH_BUCKET during HeadBucket "
                      "operation: NoSuchBucket: The specified bucket does not exist")
    assert str(remote_error(missing, uri)) == f"{uri}: the bucket does not exist (create it, or check the URI)"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    refused = OSError("When reading information for key 'e' in bucket 'nobucket': AWS Error NETWORK_CONNECTION during "
                      "HeadObject operation: curlCode: 7, Couldn't connect to server")
    err = remote_error(refused, uri)
    assert isinstance(err, EndpointError) and "cannot reach 127.0.0.1:1" in str(err), str(err)


def test_lance_errors_become_one_short_line():
    """Lance's messages name Rust source places, some a whole HTTP response (2.9 KB for missing credentials)."""
    from lmdata.io.s3 import library_text, remote_error

    creds = OSError("LanceError(IO): Generic N/A error: Failed to get AWS credentials: ProviderError(TokenError { kind: "
                    "Forbidden }, raw: Response { status: 403, headers: {" + "x: y, " * 300 + "} }), "
                    "/home/runner/work/lance/lance/rust/lance-io/src/object_store/providers/aws.rs:630:30")
    said = str(remote_error(creds, "s3://b/store/train/lance"))
    assert said == ("s3://b/store/train/lance: access denied (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the "
                    "bucket's permissions)")
    gone = OSError("Not found: b/store/train/lance/data/x.lance, "
                   "/rustc/90b35a6239c3d8bdabc530a6a0816f7ff89a0aaf/library/core/src/ops/function.rs:250:5")
    assert library_text(gone) == "Not found: b/store/train/lance/data/x.lance"
    assert len(library_text(creds)) <= 240 and library_text(creds).endswith("...")
