"""Where a store or an input lives: a local path or an ``s3://`` URI, and the filesystem for it.

    loc = location("s3://bucket/runs/store")   # Location('s3://bucket/runs/store')
    loc.remote, loc.fs_path                    # True, 'bucket/runs/store'
    (loc / "train" / "memmap").uri             # 's3://bucket/runs/store/train/memmap'
    loc.fs                                     # pyarrow.fs.S3FileSystem from the AWS environment
    loc.storage_options()                      # the same settings as Lance storage options
    location("runs/store").local_path          # PosixPath('runs/store')
    location("gs://b/x")                       # LmdataError: unknown scheme (never a dir 'gs:')

A ``Location`` holds strings only: it pickles small to loader workers, and each process
builds its filesystem once (``s3_filesystem`` is memoized per process and per environment).

Endpoint and credentials come from the standard AWS environment, nothing lmdata-specific:
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (``http://host:port`` allowed: the scheme is
passed to pyarrow explicitly), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION``. With a custom endpoint,
``AWS_REQUEST_CHECKSUM_CALCULATION`` defaults to ``WHEN_REQUIRED`` (S3-compatible servers
reject the SDK's newer default checksums). Timeouts and retries are the libraries': a short
connect timeout (``CONNECT_TIMEOUT_S``) and ``RETRIES`` attempts, so an unreachable endpoint
fails in seconds; ``remote_error`` turns a library failure into one line naming the object.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from lmdata.errors import LmdataError

SCHEMES = ("s3",)
CONNECT_TIMEOUT_S = 3.0
RETRIES = 3
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
_ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION")
_SDK_ENV = ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION")


def aws_environment() -> dict[str, str]:
    """This process's AWS settings, for a worker started before they were set (Ray tasks, loader workers)."""
    return {k: os.environ[k] for k in _ENV + _SDK_ENV if k in os.environ}


def apply_aws_environment(env: dict[str, str]) -> None:
    """Adopt the AWS settings of the process that sent ``env`` (see ``aws_environment``)."""
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
_filesystems: dict[tuple, Any] = {}  # per process: environment -> S3FileSystem


def is_uri(text: str | os.PathLike) -> bool:
    """Whether ``text`` names an object-storage URI (any ``scheme://``, known or not)."""
    return isinstance(text, str) and _URI.match(text) is not None


def location(where: "str | os.PathLike | Location", *, flag: str = "path") -> "Location":
    """``where`` as a ``Location``; an unknown ``scheme://`` is an error naming ``flag``.

    ``file://PATH`` is the local ``PATH``.
    """
    if isinstance(where, Location):
        return where
    if not isinstance(where, str):
        return Location("file", os.fspath(where))
    m = _URI.match(where)
    if m is None:
        return Location("file", where)
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme == "file":
        return Location("file", rest)
    if scheme not in SCHEMES:
        raise LmdataError(
            f"{flag} {where!r}: unknown URI scheme {scheme!r}; use a local path or s3://bucket/prefix"
        )
    rest = rest.strip("/")
    if not rest or rest.startswith("/"):
        raise LmdataError(f"{flag} {where!r}: no bucket; write s3://bucket/prefix")
    return Location(scheme, re.sub(r"/+", "/", rest))


class Location:
    """A local path or an object-storage URI: joins like a path, reads and writes whole objects."""

    __slots__ = ("scheme", "path")

    def __init__(self, scheme: str, path: str) -> None:
        self.scheme, self.path = scheme, path

    # -- naming -------------------------------------------------------------------------------
    @property
    def remote(self) -> bool:
        return self.scheme != "file"

    @property
    def uri(self) -> str:
        """What the user wrote: ``s3://bucket/key`` or the local path."""
        return f"{self.scheme}://{self.path}" if self.remote else self.path

    @property
    def bucket(self) -> str:
        return self.path.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> "Location":
        if not self.remote:
            return Location("file", str(Path(self.path).parent))
        return Location(self.scheme, self.path.rsplit("/", 1)[0] if "/" in self.path else self.path)

    @property
    def local_path(self) -> Path:
        if self.remote:
            raise AssertionError(f"{self.uri} is not a local path")
        return Path(self.path)

    @property
    def fs_path(self) -> str:
        """The path the filesystem takes: ``bucket/key``, or the local absolute path."""
        return self.path if self.remote else os.path.abspath(self.path)

    def __truediv__(self, part: str) -> "Location":
        if not self.remote:
            return Location("file", os.path.join(self.path, part))
        return Location(self.scheme, f"{self.path}/{str(part).strip('/')}")

    def __str__(self) -> str:
        return self.uri

    def __fspath__(self) -> str:  # only local locations are paths
        return str(self.local_path)

    def __repr__(self) -> str:
        return f"Location({self.uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and (self.scheme, self.path) == (other.scheme, other.path)

    def __hash__(self) -> int:
        return hash((self.scheme, self.path))

    def __getstate__(self) -> tuple:
        # A remote location carries the AWS settings it was made under, so a loader worker
        # (a forkserver child started before the caller set them) reads the same endpoint.
        return (self.scheme, self.path, aws_environment() if self.remote else {})

    def __setstate__(self, state: tuple) -> None:
        self.scheme, self.path = state[0], state[1]
        apply_aws_environment(state[2] if len(state) > 2 else {})

    # -- the filesystem ---------------------------------------------------------------------------
    @property
    def fs(self) -> Any:
        if not self.remote:
            import pyarrow.fs as pafs

            return pafs.LocalFileSystem()
        return s3_filesystem()

    def storage_options(self) -> dict[str, str]:
        """Lance's ``storage_options`` for this location (empty for a local path)."""
        return lance_storage_options() if self.remote else {}

    def info(self) -> Any:
        """pyarrow ``FileInfo`` (``.type``, ``.size``); a missing object has type NotFound."""
        try:
            return self.fs.get_file_info(self.fs_path)
        except OSError as exc:
            raise remote_error(exc, self) from None

    def exists(self) -> bool:
        import pyarrow.fs as pafs

        return self.info().type != pafs.FileType.NotFound

    def is_file(self) -> bool:
        import pyarrow.fs as pafs

        return self.info().type == pafs.FileType.File

    def size(self) -> int | None:
        """Bytes of the object, or None when there is none."""
        info = self.info()
        return info.size if self.is_file_info(info) else None

    @staticmethod
    def is_file_info(info: Any) -> bool:
        import pyarrow.fs as pafs

        return info.type == pafs.FileType.File

    def read_bytes(self) -> bytes:
        """The whole object (one GET); a missing one is ``FileNotFoundError``."""
        try:
            with self.fs.open_input_stream(self.fs_path) as fh:
                return fh.read()
        except FileNotFoundError:
            raise
        except OSError as exc:
            if _missing(exc):
                raise FileNotFoundError(self.uri) from None
            raise remote_error(exc, self) from None

    def write_bytes(self, data: bytes) -> None:
        """Replace the object with ``data``: one PUT, all or nothing (a local path: tmp + fsync + rename)."""
        if not self.remote:
            from lmdata import _atomic

            self.local_path.parent.mkdir(parents=True, exist_ok=True)
            _atomic.write_bytes(self.local_path, data)
            return
        try:
            with self.fs.open_output_stream(self.fs_path) as fh:
                fh.write(data)
        except OSError as exc:
            raise remote_error(exc, self) from None

    def open_input(self) -> Any:
        """A random-access file (``read_at`` is safe from many threads); remote: one HEAD to open.

        Open once per process and keep it: pyarrow's Python API takes no size to skip the HEAD.
        """
        try:
            return self.fs.open_input_file(self.fs_path)
        except OSError as exc:
            if _missing(exc):
                raise FileNotFoundError(self.uri) from None
            raise remote_error(exc, self) from None

    def upload(self, local: Path) -> None:
        """Copy a local file to this object (multipart for large files: pyarrow's)."""
        import pyarrow.fs as pafs

        try:
            pafs.copy_files(os.path.abspath(local), self.fs_path, source_filesystem=pafs.LocalFileSystem(),
                            destination_filesystem=self.fs)
        except OSError as exc:
            raise remote_error(exc, self) from None

    def delete(self) -> None:
        """Remove the object if it exists."""
        try:
            self.fs.delete_file(self.fs_path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if not _missing(exc):
                raise remote_error(exc, self) from None

    def delete_tree(self) -> None:
        """Remove every object under this prefix."""
        try:
            self.fs.delete_dir_contents(self.fs_path, missing_dir_ok=True)
        except OSError as exc:
            raise remote_error(exc, self) from None

    def list(self, recursive: bool = False) -> list["Location"]:
        """Files under this prefix (empty when there are none), sorted."""
        import pyarrow.fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.fs_path, allow_not_found=True, recursive=recursive))
        except OSError as exc:
            raise remote_error(exc, self) from None
        base = self.fs_path.rstrip("/")
        found = []
        for info in infos:
            if info.type == pafs.FileType.File:
                found.append(self / info.path[len(base) + 1:])
        return sorted(found, key=lambda loc: loc.path)


def glob(pattern: str, *, flag: str = "--input") -> list[Location]:
    """The objects matching an ``s3://bucket/prefix/*.txt`` pattern (``*``, ``?``, ``[...]``; ``**`` spans /)."""
    loc = location(pattern, flag=flag)
    assert loc.remote, "local globs are the caller's (pathlib)"
    parts = loc.path.split("/")
    fixed = next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), len(parts))
    if fixed == len(parts):
        return [loc] if loc.is_file() else []
    base = Location(loc.scheme, "/".join(parts[:fixed]))
    regex = re.compile(_glob_regex("/".join(parts[fixed:])))
    return [m for m in base.list(recursive=True) if regex.fullmatch(m.path[len(base.path) + 1:])]


def _glob_regex(pattern: str) -> str:
    """Shell glob -> regex: ``*`` and ``?`` stay inside one path segment, ``**`` spans segments."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        c = pattern[i]
        end = pattern.find("]", i + 1) if c == "[" else -1
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif end > i + 1:
            body = pattern[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


# -- the AWS environment ------------------------------------------------------------------------
def aws_settings() -> dict[str, str | None]:
    """What the standard AWS environment says: endpoint (scheme split off), keys, region."""
    env = os.environ
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
    scheme = None
    if endpoint:
        m = re.match(r"^(https?)://(.+?)/*$", endpoint)
        if m is None:
            raise LmdataError(
                f"AWS_ENDPOINT_URL={endpoint!r}: write the endpoint as http://host:port or https://host"
            )
        scheme, endpoint = m.group(1), m.group(2)
    return {
        "endpoint": endpoint, "scheme": scheme,
        "access_key": env.get("AWS_ACCESS_KEY_ID") or None,
        "secret_key": env.get("AWS_SECRET_ACCESS_KEY") or None,
        "session_token": env.get("AWS_SESSION_TOKEN") or None,
        "region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
    }


def s3_filesystem() -> Any:
    """The process's ``pyarrow.fs.S3FileSystem`` for the current AWS environment (memoized)."""
    key = (os.getpid(),) + tuple(os.environ.get(k) for k in _ENV)
    fs = _filesystems.get(key)
    if fs is None:
        import pyarrow.fs as pafs

        s = aws_settings()
        if s["endpoint"]:
            os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "WHEN_REQUIRED")
            os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "WHEN_REQUIRED")
        kwargs: dict[str, Any] = {
            "region": s["region"] or "us-east-1",
            "connect_timeout": CONNECT_TIMEOUT_S,
            "request_timeout": 30.0,
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=RETRIES),
        }
        if s["endpoint"]:
            kwargs.update(endpoint_override=s["endpoint"], scheme=s["scheme"])
        if s["access_key"] and s["secret_key"]:
            kwargs.update(access_key=s["access_key"], secret_key=s["secret_key"], session_token=s["session_token"])
        fs = _filesystems[key] = pafs.S3FileSystem(**kwargs)
    return fs


def lance_storage_options() -> dict[str, str]:
    """Lance ``storage_options`` from the same environment (so Lance and pyarrow agree)."""
    s = aws_settings()
    opts = {
        "aws_region": s["region"] or "us-east-1",
        "connect_timeout": f"{CONNECT_TIMEOUT_S:g}s",
        "client_max_retries": str(RETRIES),
        "client_retry_timeout": "20",
    }
    if s["endpoint"]:
        opts["aws_endpoint"] = f"{s['scheme']}://{s['endpoint']}"
        if s["scheme"] == "http":
            opts["allow_http"] = "true"
    for ours, theirs in (("access_key", "aws_access_key_id"), ("secret_key", "aws_secret_access_key"),
                         ("session_token", "aws_session_token")):
        if s[ours]:
            opts[theirs] = s[ours]
    return opts


# -- errors -------------------------------------------------------------------------------------
def _missing(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, FileNotFoundError) or "NoSuchKey" in text or "Path does not exist" in text or (
        "HTTP response code: 404" in text and "NoSuchBucket" not in text and "bucket does not exist" not in text)


def remote_error(exc: BaseException, where: "Location | str") -> LmdataError:
    """A library's failure on ``where`` as one line naming the object and the likely fix."""
    if isinstance(exc, LmdataError):
        return exc
    uri = where.uri if isinstance(where, Location) else str(where)
    text = " ".join(str(exc).split())
    low = text.lower()
    if any(s in low for s in ("nosuchbucket", "bucket does not exist", "the specified bucket")):
        why = "the bucket does not exist (create it, or check the URI)"
    elif any(s in low for s in ("access_denied", "accessdenied", "invalidaccesskeyid", "invalid_access_key_id", "signaturedoesnotmatch",
                                "signature_does_not_match",
                                "403", "forbidden", "credentials", "invalidtoken")):
        why = "access denied (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the bucket's permissions)"
    elif any(s in low for s in ("couldn't connect", "curlcode: 7", "connection refused", "timed out", "timeout",
                                "could not resolve", "curlcode: 6", "curlcode: 28", "network", "dns error",
                                "tcp connect", "error trying to connect", "connection")):
        endpoint = aws_settings()["endpoint"] or "the AWS default endpoint"
        why = f"cannot reach {endpoint} (check AWS_ENDPOINT_URL and the network)"
    elif _missing(exc):
        why = "no such object"
    else:
        why = f"{type(exc).__name__}: {text[:300]}"
    return LmdataError(f"{uri}: {why}")
