"""The S3 filesystem from the standard AWS environment, Lance's options from the same, and
one line per failure.

Endpoint and credentials come from the standard AWS environment, nothing lmdata-specific:
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (``http://host:port`` allowed: the scheme is
passed to pyarrow explicitly), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION``. With a custom endpoint,
``AWS_REQUEST_CHECKSUM_CALCULATION`` defaults to ``WHEN_REQUIRED`` (S3-compatible servers
reject the SDK's newer default checksums). Timeouts and retries are the libraries': a short
connect timeout (``CONNECT_TIMEOUT_S``) and ``RETRIES`` attempts, so an unreachable endpoint
fails in seconds; ``remote_error`` turns a library failure into one line naming the object.

An endpoint that stops answering with its sockets open (issue 29.10: a Lance run waited on
for 240 s and more, memmap failed after 186 s) fails once ``LMDATA_S3_TIMEOUT`` seconds
(``s3_timeout``, default ``TIMEOUT_S``) pass with no answer, retries included: each of the
``RETRIES`` attempts may take a ``RETRIES``-th of it (pyarrow's ``request_timeout``, Lance's
``timeout``), and the error names the object and the setting.

A process builds its filesystem once per environment (``s3_filesystem``, process-local:
a loader worker or a Ray task builds its own).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Callable, TypeVar

from lmdata.errors import LmdataError
from lmdata.io.env import env_number
from lmdata.io.bounded import Bounded
from lmdata.io.process_local import ProcessLocal

T = TypeVar("T")

CONNECT_TIMEOUT_S = 3.0
RETRIES = 3
TIMEOUT_ENV = "LMDATA_S3_TIMEOUT"
TIMEOUT_S = 60.0  # no answer for this long, retries included: the read fails
ENV = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
       "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", TIMEOUT_ENV)
SDK_ENV = ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION")

_filesystems: ProcessLocal[dict[tuple, Any]] = ProcessLocal(dict)  # environment -> S3FileSystem


def aws_environment() -> dict[str, str]:
    """This process's AWS settings, for a worker started before they were set (Ray tasks, loader workers)."""
    return {k: os.environ[k] for k in ENV + SDK_ENV if k in os.environ}


def apply_aws_environment(env: dict[str, str]) -> None:
    """Adopt the AWS settings of the process that sent ``env`` (see ``aws_environment``)."""
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


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


def s3_timeout() -> float:
    """Seconds a request to object storage may go unanswered, retries included (``LMDATA_S3_TIMEOUT``)."""
    return env_number(TIMEOUT_ENV, TIMEOUT_S, lambda v: 0 < v < math.inf, "give the seconds a request to object "
                      f"storage may wait for an answer, a number > 0 (default {TIMEOUT_S:g})")


def attempt_timeout() -> float:
    """One attempt's share of ``s3_timeout()`` (a library retries a timed-out request ``RETRIES`` times)."""
    return max(s3_timeout() / RETRIES, 1.0)


def s3_filesystem() -> Any:
    """This process's ``pyarrow.fs.S3FileSystem`` for the current AWS environment (built once)."""
    key = tuple(os.environ.get(k) for k in ENV)
    built = _filesystems.get()
    fs = built.get(key)
    if fs is None:
        import pyarrow.fs as pafs

        s = aws_settings()
        if s["endpoint"]:
            os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "WHEN_REQUIRED")
            os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "WHEN_REQUIRED")
        kwargs: dict[str, Any] = {
            "region": s["region"] or "us-east-1",
            "connect_timeout": CONNECT_TIMEOUT_S,
            "request_timeout": attempt_timeout(),
            "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=RETRIES),
        }
        if s["endpoint"]:
            kwargs.update(endpoint_override=s["endpoint"], scheme=s["scheme"])
        if s["access_key"] and s["secret_key"]:
            kwargs.update(access_key=s["access_key"], secret_key=s["secret_key"], session_token=s["session_token"])
        fs = built[key] = pafs.S3FileSystem(**kwargs)
    return fs


def lance_storage_options() -> dict[str, str]:
    """Lance ``storage_options`` from the same environment (so Lance and pyarrow agree)."""
    s = aws_settings()
    opts = {
        "aws_region": s["region"] or "us-east-1",
        "connect_timeout": f"{CONNECT_TIMEOUT_S:g}s",
        "timeout": f"{max(s3_timeout() / (RETRIES + 1), 1.0):g}s",  # object_store: RETRIES retries after the first
        "client_max_retries": str(RETRIES),
        "client_retry_timeout": f"{s3_timeout():g}",
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
def is_missing(exc: BaseException) -> bool:
    """Whether a library's failure means "no such object" (not a missing bucket, not the network)."""
    text = str(exc)
    return isinstance(exc, FileNotFoundError) or "NoSuchKey" in text or "Path does not exist" in text or (
        "HTTP response code: 404" in text and "NoSuchBucket" not in text and "bucket does not exist" not in text)


_DENIED = ("access_denied", "accessdenied", "invalidaccesskeyid", "invalid_access_key_id", "signaturedoesnotmatch",
           "signature_does_not_match", "forbidden", "credentials", "invalidtoken")
_TIMED_OUT = ("timed out", "timeout", "curlcode: 28", "deadline has elapsed", "operation too slow",
              "error sending request")  # Lance's (reqwest's) words for a request that got no answer
_CONNECTING = ("connection timed out", "connect timeout", "connect_timeout", "tcp connect", "error trying to connect")
_UNREACHABLE = ("couldn't connect", "curlcode: 7", "connection refused", "timed out", "timeout",
                "could not resolve", "curlcode: 6", "curlcode: 28", "network", "dns error",
                "tcp connect", "error trying to connect", "connection")


class EndpointError(LmdataError):
    """The endpoint failed (no answer in time, unreachable), not one object: a caller that would
    retry other objects to find the bad one only waits the same timeout again."""


def no_answer(uri: str) -> EndpointError:
    """The endpoint kept ``uri``'s request open and never answered within ``s3_timeout()``."""
    endpoint = aws_settings()["endpoint"] or "the AWS default endpoint"
    return EndpointError(f"{uri}: no answer from {endpoint} within {TIMEOUT_ENV}={s3_timeout():g} s (retries "
                         f"included); check the endpoint, or raise {TIMEOUT_ENV} for a slow one")


def within_timeout(call: Callable[[], T], uri: str) -> T:
    """``call()``, a remote read whose library nests its own retries, bounded by ``s3_timeout()``.

    Lance retries a take's every GET, each under its own timeout: a frozen endpoint held a
    take ~170 s with a 10 s setting. Past the deadline: ``no_answer(uri)``, the call left
    to end on its daemon thread.
    """
    running = Bounded(call, "lmdata-remote")
    if not running.wait(s3_timeout()):
        raise no_answer(uri)
    return running.result()


def _library_words(text: str, uri: str) -> str:
    """``text`` lowercased without the bucket and key it names (pyarrow's messages quote them): a
    frozen endpoint's timeout on bucket ``t-0396d9b11403`` had read as "access denied" (its "403"),
    as would any failure on a key ``forbidden.txt``.  Only whole names go (not inside a word)."""
    low = text.lower()
    for name in sorted({p for p in uri.removeprefix("s3://").lower().split("/") if p}, key=len, reverse=True):
        # as a whole name only: a key "s" had taken every "s" out of the library's words ("nosuchbucket")
        low = re.sub(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])", " ", low)
    return low


def _denied(low: str) -> bool:
    return any(s in low for s in _DENIED) or re.search(r"(?<![0-9])403(?![0-9])", low) is not None


_SOURCE_PLACE = re.compile(r",?\s*(?:/rustc/|/home/runner/|/Users/runner/|[A-Za-z]:\\\\)\S*|\s+at \S+\.rs:\d+:\d+")


def library_text(exc: BaseException, limit: int = 240) -> str:
    """A library's message on one line, short: Lance's (Rust's) name the source file and line of the error,
    sometimes a whole HTTP response in debug form (a 2.9 KB line for missing credentials)."""
    text = _SOURCE_PLACE.sub("", " ".join(str(exc).split()))
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def remote_error(exc: BaseException, uri: str) -> LmdataError:
    """A library's failure on the object ``uri`` as one line naming it and the likely fix."""
    if isinstance(exc, LmdataError):
        return exc
    text = " ".join(str(exc).split())
    low = _library_words(text, uri)
    if any(s in low for s in ("nosuchbucket", "bucket does not exist", "the specified bucket")):
        why = "the bucket does not exist (create it, or check the URI)"
    elif _denied(low):
        why = "access denied (check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the bucket's permissions)"
    elif any(s in low for s in _TIMED_OUT) and not any(s in low for s in _CONNECTING):
        return no_answer(uri)
    elif any(s in low for s in _UNREACHABLE):
        endpoint = aws_settings()["endpoint"] or "the AWS default endpoint"
        return EndpointError(f"{uri}: cannot reach {endpoint} (check AWS_ENDPOINT_URL and the network)")
    elif is_missing(exc):
        why = "no such object"
    else:
        why = f"{type(exc).__name__}: {library_text(exc)}"
    return LmdataError(f"{uri}: {why}")
