"""What tokenizer training reads: the inputs ``lmdata ingest`` reads, as decompressed bytes.

A local file, an ``s3://bucket/key`` object, a local or ``s3://`` glob (expanded as
ingest's are: ``sources.expand``), each plain, ``.gz`` or ``.zst``, opened through
``streams.open_binary`` and read block by block, never whole. ``check_inputs`` opens every
input once before any counting, so a bad one is one line naming it:

    check_inputs(["s3://b/raw/*.txt"])  # [Location('s3://b/raw/a.txt'), Location('s3://b/raw/b.txt')]
    check_inputs(["s3://b/nope.txt"])   # LmdataError: input s3://b/nope.txt: no such object
"""

from __future__ import annotations

import glob
import gzip
import zlib
from pathlib import Path
from typing import IO, TYPE_CHECKING, Union

from lmdata.errors import LmdataError
from lmdata.store.uri import is_uri, remote_error
from lmdata.streams import file_size, is_remote, open_binary, strip_compression

if TYPE_CHECKING:
    from lmdata.store.uri import Location

Input = Union[Path, "Location"]  # a local file, or an object for s3://
# What reading an input raises: the disk or network (OSError), a truncated or corrupt .gz/.zst
READ_ERRORS = (OSError, EOFError, zlib.error)


def resolve_inputs(inputs: str | Path | Location | list | tuple) -> list[Input]:
    """Inputs as files: a URI or a glob (a ``str``) expands as ingest's do; a plain local path stays as given,
    so ``check_inputs`` can say what is wrong with it."""
    items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    files: list[Input] = []
    for item in items:
        if isinstance(item, str) and (is_uri(item) or glob.has_magic(item)):  # file://PATH: expand's local PATH
            from lmdata.sources import expand

            files.extend(expand([item]))
        else:
            files.append(item if is_remote(item) else Path(item))
    return files


def check_inputs(inputs: str | Path | Location | list | tuple) -> list[Input]:
    """Fail early, naming the input, on a missing, unreadable, empty or directory input (local or s3://)."""
    files = resolve_inputs(inputs)
    if not files:
        raise LmdataError("no INPUT given; name at least one text file or s3:// object")
    for path in files:
        if not is_remote(path) and path.is_dir():
            raise LmdataError(f"{path}: is a directory; give a text file")
        with open_input(path) as f:
            empty = not read_block(f, path, 1)
        if empty:
            raise LmdataError(f"{path}: is empty; give a file with text to train on")
    return files


def open_input(path: Input) -> IO[bytes]:
    """The input's (decompressed) bytes as a stream, or one line saying why it cannot be opened."""
    try:
        return open_binary(path)
    except LmdataError as exc:  # open_binary names the file; ours also says what to do
        if isinstance(exc.__cause__, OSError):
            raise read_error(path, exc.__cause__) from None
        raise


def read_block(f: IO[bytes], path: Input, size: int) -> bytes:
    """Up to ``size`` decompressed bytes; a failing disk, network or compressed stream is one line."""
    try:
        return f.read(size)
    except READ_ERRORS as exc:
        raise read_error(path, exc) from None


def read_error(path: Input, exc: BaseException) -> LmdataError:
    """Why ``path`` cannot be read, in one line naming it (remote: ``remote_error``'s likely fix)."""
    if isinstance(exc, FileNotFoundError) and not is_remote(path):
        return LmdataError(f"{path}: no such file")
    if isinstance(exc, IsADirectoryError):
        return LmdataError(f"{path}: is a directory; give a text file")
    if is_remote(path) and not _bad_compressed_data(exc):
        return remote_error(exc, path)
    reason = getattr(exc, "strerror", None) or " ".join(str(exc).split()) or type(exc).__name__
    return LmdataError(f"{path}: cannot read ({reason})")


def _bad_compressed_data(exc: BaseException) -> bool:
    """A truncated or corrupt .gz/.zst stream (the bytes arrived; they do not decompress)."""
    return isinstance(exc, (EOFError, zlib.error, gzip.BadGzipFile)) or "zstd" in str(exc)


def is_compressed(path: Input) -> bool:
    return strip_compression(path)[1] is not None


def stored_bytes(paths: list[Input]) -> tuple[int, int | None]:
    """(bytes stored, the text bytes to read or None): the text's size is known up front only uncompressed."""
    stored = sum(file_size(p) or 0 for p in paths)
    return stored, None if any(is_compressed(p) for p in paths) else stored
