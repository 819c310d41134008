"""Input bytes as they stream: a local file or an ``s3://`` object, decompressed once
(``.gz``, ``.zst``) by its name, and one line for whatever goes wrong reading it.

    with open_binary(location("s3://raw/t.jsonl.gz")) as fh:   # the decompressed bytes
        for line in fh: ...
    open_seekable(loc)       # the stored bytes with random access (a Parquet input's footer)
    read_error(loc, exc)     # any of READ_ERRORS as one line naming the input

The stored bytes come from ``Location.open_stream``, which never decompresses, so an object
uploaded by any tool (``aws s3 cp``, boto3) reads as the same file would locally.
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import IO, Any

from lmdata.errors import LmdataError
from lmdata.io.location import Location
from lmdata.io.s3 import remote_error

# What reading an input raises: the disk or network (OSError), a truncated or corrupt .gz/.zst
READ_ERRORS = (OSError, EOFError, zlib.error)
COMPRESSIONS = (".gz", ".zst")


def open_seekable(loc: Location) -> Any:
    """The stored bytes with random access: a local file, or a pyarrow random-access object file."""
    if not loc.remote:
        return open(loc.path, "rb")
    return loc.open_input()


def strip_compression(path: Any) -> tuple[str, str | None]:
    """(the name without its compression suffix, lowercased; ".gz", ".zst" or None)."""
    name = path.name.lower()
    for ext in COMPRESSIONS:
        if name.endswith(ext):
            return name[: -len(ext)], ext
    return name, None


def open_binary(loc: Location) -> IO[bytes]:
    """A buffered binary stream of the input's bytes, decompressed by its name (``.gz``, ``.zst``)."""
    _, comp = strip_compression(loc)
    try:
        raw = loc.open_stream()
    except OSError as exc:
        raise read_error(loc, exc) from None
    if comp == ".gz":
        return _OwningGzip(raw)
    if comp == ".zst":
        return io.BufferedReader(_ZstdReader(raw), 1 << 20)
    return raw


class _OwningGzip(gzip.GzipFile):
    """A ``GzipFile`` over a stream it closes with itself (``gzip.open`` leaves a passed stream open)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        super().__init__(fileobj=raw, mode="rb")

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


FEED_BYTES = 1 << 16  # compressed bytes per decompress call: text at 10x is 640 KB out, not 10 MB


class _ZstdReader(io.RawIOBase):
    """Decompressed bytes of a (multi-frame) .zst stream; a truncated frame is an EOFError.

    (zstandard's own ``stream_reader`` ends quietly at a truncated frame: a cut-off file
    would pass for a shorter corpus.)
    """

    def __init__(self, raw: IO[bytes]) -> None:
        import zstandard

        self._zstd, self._raw = zstandard, raw
        self._dobj = zstandard.ZstdDecompressor().decompressobj()
        self._buf, self._pos, self._fed = b"", 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, out: Any) -> int:
        while self._pos >= len(self._buf):
            chunk = b""
            if self._dobj.eof:  # a frame ended: the next one starts with what it left over
                chunk = self._dobj.unused_data
                self._dobj, self._fed = self._zstd.ZstdDecompressor().decompressobj(), False
            chunk = chunk or self._raw.read(FEED_BYTES)
            if not chunk:
                if self._fed and not self._dobj.eof:
                    raise EOFError("the stream ends inside a zstd frame (truncated file)")
                return 0
            self._fed = True
            try:
                self._buf, self._pos = self._dobj.decompress(chunk), 0
            except self._zstd.ZstdError as exc:
                raise OSError(f"corrupt zstd data ({exc})") from None
        n = min(len(out), len(self._buf) - self._pos)
        out[:n] = self._buf[self._pos : self._pos + n]
        self._pos += n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def fetch_hint(path: Any) -> str:
    """Where to read how to get a missing local input: the README.md of its nearest existing folder
    (data/README.md for data/tinystories/...), when that folder is not the working directory."""
    from pathlib import Path

    here, folder = Path.cwd().resolve(), Path(path).absolute().parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    if folder.resolve() == here or not (folder / "README.md").is_file():
        return ""
    shown = folder / "README.md"
    shown = shown.resolve().relative_to(here) if shown.resolve().is_relative_to(here) else shown
    return f"; {shown} says how to get the data"


def read_error(loc: Any, exc: BaseException) -> LmdataError:
    """Why the input ``loc`` cannot be read, in one line naming it (remote: the likely fix)."""
    if isinstance(exc, LmdataError):
        return exc
    remote = isinstance(loc, Location) and loc.remote
    if isinstance(exc, FileNotFoundError) and not remote:
        return LmdataError(f"{loc}: no such file{fetch_hint(loc.local_path if isinstance(loc, Location) else loc)}")
    if isinstance(exc, IsADirectoryError):
        return LmdataError(f"{loc}: is a directory; give a text file")
    if is_bad_compressed_data(exc):
        return LmdataError(f"{loc}: cannot read: corrupt or truncated compressed data ({' '.join(str(exc).split())})")
    if remote:
        return remote_error(exc, str(loc))
    reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
    return LmdataError(f"{loc}: cannot read ({reason})")


def is_bad_compressed_data(exc: BaseException) -> bool:
    """A truncated or corrupt .gz/.zst stream (the bytes arrived; they do not decompress)."""
    return isinstance(exc, (EOFError, zlib.error, gzip.BadGzipFile)) or "zstd" in str(exc)
