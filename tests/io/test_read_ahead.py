"""Objects read front to back with parts fetched ahead (``io/read_ahead.py``)."""

from __future__ import annotations

import gzip
import io
import os
import threading

import pytest

from lmdata.errors import LmdataError
from lmdata.io.location import location
from lmdata.io.read_ahead import ReadAhead


class FakeFile:
    """A pyarrow random-access file: ``read_at`` from threads, each call recorded."""

    def __init__(self, data: bytes, together: int = 1, fail_at: int | None = None) -> None:
        self.data, self.calls, self.closed = data, [], False
        self.fail_at = fail_at
        self._together = threading.Barrier(together, timeout=10) if together > 1 else None

    def size(self) -> int:
        return len(self.data)

    def read_at(self, n: int, at: int) -> bytes:
        self.calls.append((at, n))
        if self._together is not None and at < 20:  # the first two parts (of 10 bytes) are asked for together
            self._together.wait()
        if self.fail_at is not None and at >= self.fail_at:
            raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation: connection reset")
        return self.data[at:at + n]

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("size", [0, 1, 9, 10, 11, 95, 100])
def test_every_byte_in_order_in_parts(size):
    data = os.urandom(size)
    f = FakeFile(data)
    with io.BufferedReader(ReadAhead(f, "s3://b/x", part_bytes=10, ahead=3), 4) as fh:
        assert fh.read() == data
    assert sorted(f.calls) == [(at, min(10, size - at)) for at in range(0, size, 10)] and f.closed


def test_parts_ahead_are_fetched_at_the_same_time():
    """The first two parts' reads wait for each other (a barrier): read one at a time, they never meet."""
    data = os.urandom(100)
    with io.BufferedReader(ReadAhead(FakeFile(data, together=2), "s3://b/x", part_bytes=10, ahead=2), 4) as fh:
        assert fh.read() == data


def test_a_failing_part_is_one_line_naming_the_object():
    f = FakeFile(os.urandom(100), fail_at=50)
    with io.BufferedReader(ReadAhead(f, "s3://b/input.txt", part_bytes=10, ahead=2), 4) as fh:
        with pytest.raises(LmdataError, match="s3://b/input.txt") as err:
            fh.read()
    assert "\n" not in str(err.value)


def test_an_object_uploaded_with_boto3_streams_in_parts_ahead(s3, monkeypatch):
    """20 MiB and its gzip, uploaded as `aws s3 cp` would: a HEAD and 3 parts of 8 MiB (1 MiB reads
    had been 20 GETs, one after another)."""
    from lmdata.bench.delay_proxy import DelayProxy
    from lmdata.io.streams import open_binary

    data = os.urandom(20 << 20)
    plain = s3.put("in/a.bin", data)
    text = b"".join(b"line %d\n" % i for i in range(200_000))
    packed = s3.put("in/b.txt.gz", gzip.compress(text))
    with DelayProxy(s3.server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
        with location(plain).open_stream() as fh:
            assert fh.read(1 << 20) == data[:1 << 20] and fh.read() == data[1 << 20:]
        assert proxy.requests == 4
        with open_binary(location(packed)) as fh:
            assert fh.read() == text
