"""An object read front to back with a few ranged GETs in flight ahead of the reader.

    raw = ReadAhead(fs.open_input_file(path), "s3://b/input.txt")   # a HEAD (the size)
    io.BufferedReader(raw, 1 << 20).read(...)                       # parts of PART_BYTES, AHEAD at once

pyarrow reads an S3 input stream one request at a time, each ``read(n)`` a GET of ``n`` bytes
(256 KiB at a time for ``read()``), so a stream's rate is a part per round trip: at 20-50 ms
a request, 20-50 MB/s for 1 MiB reads, below the 150 MB/s two cores encode at. Here the parts
ahead of the reader are fetched on threads (``read_at`` of a pyarrow file is safe from many
threads and releases the GIL), so a round trip is paid about once per ``AHEAD`` parts. At most
``AHEAD`` parts are held (32 MiB), whatever the object's size.
"""

from __future__ import annotations

import io
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from lmdata.io.s3 import remote_error

PART_BYTES = 8 << 20
AHEAD = 4


class ReadAhead(io.RawIOBase):
    """A random-access pyarrow file read in order, ``AHEAD`` parts of ``PART_BYTES`` fetched ahead;
    a failing read is one line naming ``uri``."""

    def __init__(self, native: Any, uri: str, part_bytes: int = PART_BYTES, ahead: int = AHEAD) -> None:
        super().__init__()
        self._native, self._uri = native, uri
        self._size, self._part = native.size(), max(1, int(part_bytes))
        self._next = 0  # offset of the next part to ask for
        self._pending: deque[Future] = deque()
        self._ahead = max(1, int(ahead))
        self._pool = ThreadPoolExecutor(self._ahead, thread_name_prefix="lmdata-read-ahead")
        self._buf, self._at = b"", 0  # the part being read, and how much of it has been

    def readable(self) -> bool:
        return True

    def _ask(self) -> None:
        while len(self._pending) < self._ahead and self._next < self._size:
            n = min(self._part, self._size - self._next)
            self._pending.append(self._pool.submit(self._native.read_at, n, self._next))
            self._next += n

    def readinto(self, out: Any) -> int:
        if self._at == len(self._buf):
            self._ask()
            if not self._pending:
                return 0  # the end
            try:
                self._buf, self._at = self._pending.popleft().result(), 0
            except OSError as exc:
                raise remote_error(exc, self._uri) from None
            self._ask()
        n = min(len(out), len(self._buf) - self._at)
        out[:n] = self._buf[self._at:self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        if not self.closed and hasattr(self, "_pool"):  # (not when __init__ failed)
            self._pool.shutdown(wait=True, cancel_futures=True)  # parts not started dropped; none left running
            self._pending.clear()
            self._native.close()
        super().close()
