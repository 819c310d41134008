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
from pathlib import Path
from typing import IO

from lmdata.errors import LmdataError
from lmdata.io.location import Location, is_uri, location
from lmdata.io.streams import READ_ERRORS, open_binary, read_error, strip_compression

Input = Location  # a local file or an s3:// object


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
            files.append(location(item))
    return files


def check_inputs(inputs: str | Path | Location | list | tuple) -> list[Input]:
    """Fail early, naming the input, on a missing, unreadable, empty or directory input (local or s3://)."""
    files = resolve_inputs(inputs)
    if not files:
        raise LmdataError("no INPUT given; name at least one text file or s3:// object")
    for path in files:
        if not path.remote and path.local_path.is_dir():
            raise LmdataError(f"{path}: is a directory; give a text file")
        with open_input(path) as f:
            empty = not read_block(f, path, 1)
        if empty:
            raise LmdataError(f"{path}: is empty; give a file with text to train on")
    return files


def open_input(path: Input) -> IO[bytes]:
    """The input's (decompressed) bytes as a stream, or one line saying why it cannot be opened."""
    return open_binary(path)


def read_block(f: IO[bytes], path: Input, size: int) -> bytes:
    """Up to ``size`` decompressed bytes; a failing disk, network or compressed stream is one line."""
    try:
        return f.read(size)
    except READ_ERRORS as exc:
        raise read_error(path, exc) from None


def is_compressed(path: Input) -> bool:
    return strip_compression(path)[1] is not None


def stored_bytes(paths: list[Input]) -> tuple[int, int | None]:
    """(bytes stored, the text bytes to read or None): the text's size is known up front only uncompressed."""
    stored = sum(p.size() or 0 for p in paths)
    return stored, None if any(is_compressed(p) for p in paths) else stored
