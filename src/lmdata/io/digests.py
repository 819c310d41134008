"""The checksums a manifest records of whole files: shard files and an ingest's inputs.

A store written now records ``xxh128`` (XXH3-128, the ``xxhash`` package): ~20 GB/s on one
core of this box against sha256's ~1.7 (SHA-NI). The manifest is not signed, so anyone who
could swap a shard could rewrite its recorded sha256 too: a cryptographic hash bought no
protection a 128-bit checksum lacks, and it was the largest cost an ingest added to encoding
(2 GB of text to memmap: 2.0 of the 5-7 CPU s it added to encode-only, 1.3 s of it the input's pass).
HF ``datasets`` fingerprints and Mosaic MDS hashes use the same family; ``xxh128sum`` (the
``xxhash`` command-line tools) prints the same hex for a file. Stores and plans written with
sha256 keep it: every check takes the algorithm the entry records.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import xxhash

WRITE_ALGO = "xxh128"  # what new stores record
ALGOS = ("xxh128", "sha256")  # what a manifest entry may record (its key), newest first
_CHUNK = 1 << 20


def new(algo: str = WRITE_ALGO) -> Any:
    """A running hash of ``algo`` (``update``, ``hexdigest``; both release the GIL on large buffers)."""
    return xxhash.xxh3_128() if algo == "xxh128" else hashlib.new(algo)


def of(data: Any, algo: str = WRITE_ALGO) -> str:
    """Hex digest of a buffer (bytes, memoryview, a contiguous array's bytes)."""
    digest = new(algo)
    digest.update(data)
    return digest.hexdigest()


def of_file(path: Path | str, algo: str = WRITE_ALGO) -> str:
    """Hex digest of a file, read in 1 MiB chunks (constant memory)."""
    digest = new(algo)
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def recorded(entry: dict[str, Any]) -> tuple[str, str | None]:
    """(algorithm, hex digest or None) of a manifest or plan entry; KeyError when it records none, or two
    (one of them would be checked and the other believed)."""
    found = [algo for algo in ALGOS if algo in entry]
    if len(found) != 1:
        raise KeyError(f"two checksums ({' and '.join(found)})" if found else f"no checksum ({' or '.join(ALGOS)})")
    return found[0], entry[found[0]]
