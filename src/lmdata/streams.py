"""Input bytes: a local file or an object on object storage (``s3://``), decompressed
(``.gz``, ``.zst``) as it streams; ``sources`` cuts documents out of these streams.

``expand_remote`` lists one glob with one LIST; ``open_binary`` gives the decompressed
stream; ``file_size`` and ``input_file`` treat a ``Path`` and a ``Location`` alike.
"""

from __future__ import annotations

import glob
import gzip
import io
from pathlib import Path
from typing import IO, Any

from lmdata.errors import LmdataError
from lmdata.store.uri import is_uri


def expand_remote(pattern: str) -> list[Any]:
    from lmdata.store import uri

    matches = uri.glob(pattern, flag="input")
    if not matches:
        if glob.has_magic(pattern):
            raise LmdataError(f"input glob {pattern!r} matches no objects; check the pattern and the bucket")
        raise LmdataError(f"input {pattern}: no such object")
    return sorted(matches, key=lambda m: m.path)


def input_file(text: str) -> Any:
    """An input named by ``str(path)`` again (``expand``'s ``Path`` or ``Location``)."""
    if is_uri(text):
        from lmdata.store.uri import location

        return location(text, flag="input")
    return Path(text)


def file_size(path: Any) -> int:
    """Bytes of an input file or object."""
    return path.size() if is_remote(path) else Path(path).stat().st_size


def is_remote(path: Any) -> bool:
    return bool(getattr(path, "remote", False))


def open_raw(path: Any, seekable: bool = False) -> Any:
    """The file's stored bytes: a local file, or an object's stream (random access if ``seekable``)."""
    if not is_remote(path):
        return open(path, "rb", buffering=1 << 20)
    from lmdata.store.uri import remote_error

    try:
        if seekable:
            return path.fs.open_input_file(path.fs_path)
        return io.BufferedReader(_ArrowRaw(path.fs.open_input_stream(path.fs_path)), 1 << 20)
    except OSError as exc:
        raise remote_error(exc, path) from None


class _ArrowRaw(io.RawIOBase):
    """A pyarrow input stream as a raw Python stream (so gzip, zstd and line iteration work on it)."""

    def __init__(self, native: Any) -> None:
        self._native = native

    def readable(self) -> bool:
        return True

    def readinto(self, out: Any) -> int:
        data = self._native.read(len(out))
        out[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._native.close()
        super().close()


def strip_compression(path: Path) -> tuple[str, str | None]:
    name = path.name.lower()
    for ext in (".gz", ".zst"):
        if name.endswith(ext):
            return name[: -len(ext)], ext
    return name, None


def open_binary(path: Path) -> IO[bytes]:
    """A buffered binary stream of the file's (decompressed) bytes."""
    _, comp = strip_compression(path)
    try:
        if comp == ".gz":
            return gzip.open(path, "rb") if not is_remote(path) else _OwningGzip(open_raw(path))
        if comp == ".zst":
            return io.BufferedReader(_ZstdReader(open_raw(path)), 1 << 20)
        return open_raw(path)
    except OSError as exc:
        raise LmdataError(f"input {path}: cannot open ({exc.strerror})") from exc


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


# ---------------------------------------------------------------------------- decoding
