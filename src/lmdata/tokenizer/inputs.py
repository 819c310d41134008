"""What tokenizer training reads: the inputs ``lmdata ingest`` reads, as decompressed bytes.

A local file, an ``s3://bucket/key`` object, a local or ``s3://`` glob (expanded as
ingest's are: ``sources.expand``), each plain, ``.gz`` or ``.zst``, opened through
``streams.open_binary`` and read block by block, never whole. ``check_inputs`` opens every
input once before any counting, so a bad one is one line naming it:

    check_inputs(["s3://b/raw/*.txt"])  # [Location('s3://b/raw/a.txt'), Location('s3://b/raw/b.txt')]
    check_inputs(["s3://b/nope.txt"])   # LmdataError: input s3://b/nope.txt: no such object

A JSONL, Parquet or Arrow input (by its name, or ``kind``), and a ``lines`` one, is read as its
documents' text, as ingest cuts it (``--text-field``), each followed by a separator: the first special
token, which training never merges across. Read raw, a JSONL file had taught the tokenizer its
quotes and ``\\n`` escapes, and a Parquet file its binary pages.
"""

from __future__ import annotations

import glob
import io
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from lmdata.errors import LmdataError
from lmdata.io.location import Location, is_uri, location
from lmdata.io.streams import READ_ERRORS, open_binary, read_error, strip_compression

Input = Location  # a local file or an s3:// object


class DocumentsInput(Location):
    """An input read as its documents (``sources.iter_documents``), each text followed by ``separator``."""

    __slots__ = ("kind", "text_field", "separator", "errors")

    def __init__(self, loc: Location, kind: str, text_field: str, separator: str, errors: str) -> None:
        super().__init__(loc.scheme, loc.path)
        self.kind, self.text_field, self.separator, self.errors = kind, text_field, separator, errors

    def __getstate__(self) -> tuple:
        return (*super().__getstate__(), self.kind, self.text_field, self.separator, self.errors)

    def __setstate__(self, state: tuple) -> None:
        super().__setstate__(state[:3])
        self.kind, self.text_field, self.separator, self.errors = state[3:]

    def chunks(self, stats: Any = None) -> Iterator[bytes]:
        """Each document's text, then the separator, as UTF-8; ``stats`` (a ``SourceStats``) counts
        the invalid UTF-8 that ``errors="replace"`` replaced."""
        from lmdata.sources import SourceSpec, iter_documents

        spec = SourceSpec((self.uri,), self.kind, text_field=self.text_field, errors=self.errors)
        sep = self.separator.encode("utf-8")
        for doc in iter_documents(spec, stats, files=[Location(self.scheme, self.path)]):
            yield doc.text.encode("utf-8") + sep


class _ChunkStream(io.RawIOBase):
    """A readable stream over byte chunks (the documents of a ``DocumentsInput``). A chunk is served
    through a view: copying the rest of a 256 MB document at each 1 MiB read had taken 20 s."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._left = chunks, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        while not len(self._left):
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._left = memoryview(chunk)
        n = min(len(buf), len(self._left))
        buf[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def resolve_inputs(inputs: str | Path | Location | list | tuple, kind: str = "auto", text_field: str = "text",
                   separator: str = "\n\n", errors: str = "strict") -> list[Input]:
    """Inputs as files: a URI or a glob (a ``str``) expands as ingest's do; a plain local path stays as given,
    so ``check_inputs`` can say what is wrong with it. One that is not plain text (``kind``, by its name
    when ``auto``) is a ``DocumentsInput``."""
    from lmdata.sources import kind_of

    items = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    files: list[Input] = []
    for item in items:
        if isinstance(item, str) and (is_uri(item) or glob.has_magic(item)):  # file://PATH: expand's local PATH
            from lmdata.sources import expand

            files.extend(expand([item]))
        else:
            files.append(location(item))
    return [f if kind_of(f, kind) == "text" else DocumentsInput(f, kind_of(f, kind), text_field, separator, errors)
            for f in files]


def check_inputs(inputs: str | Path | Location | list | tuple, kind: str = "auto", text_field: str = "text",
                 separator: str = "\n\n", errors: str = "strict") -> list[Input]:
    """Fail early, naming the input, on a missing, unreadable, empty or directory input (local or s3://)."""
    files = resolve_inputs(inputs, kind, text_field, separator, errors)
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


def open_input(path: Input, stats: Any = None) -> IO[bytes]:
    """The input's (decompressed) bytes as a stream, or one line saying why it cannot be opened; a
    ``DocumentsInput``'s documents, each followed by its separator, the invalid UTF-8 their reading
    replaced added to ``stats.replacements`` (a ``pretokenize.ReadStats``) once they are all read."""
    if isinstance(path, DocumentsInput):
        from lmdata.sources import SourceStats

        def chunks() -> Iterator[bytes]:
            read = SourceStats()
            yield from path.chunks(read)
            if stats is not None:
                stats.replacements += read.replaced

        return io.BufferedReader(_ChunkStream(chunks()), 1 << 20)
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
