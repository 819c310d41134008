"""Checksums and size checks of shard files: what the manifest promises about each file.

``file_info`` records a file as the manifest stores it (relative path, bytes, sha256);
``check_sizes`` is the cheap check every reader runs before serving a shard (a short
file is an error naming it, never fewer tokens); ``sha256_file`` is the full pass of
``lmdata verify``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from lmdata.errors import LmdataError
from lmdata.store.protocol import FileInfo, ShardInfo

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (constant memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_info(format_dir: Path, relpath: str) -> FileInfo:
    """``FileInfo`` of ``format_dir / relpath`` (size and sha256 read from disk)."""
    full = Path(format_dir) / relpath
    return FileInfo(path=relpath, bytes=full.stat().st_size, sha256=sha256_file(full))


def shard_file_path(format_dir: Path, shard: ShardInfo, info: FileInfo) -> Path:
    """The absolute path of one shard file, refusing paths that leave the format directory."""
    from lmdata.store.manifest import resolve_inside

    format_dir = Path(format_dir)
    # format_dir = <store>/<split>/<format>: the store is two levels up.
    return resolve_inside(format_dir.parent.parent, format_dir, info.path)


def check_sizes(format_dir: Path, shards: list[ShardInfo]) -> None:
    """Every shard file exists with the size the manifest records, else an error naming it."""
    for shard in shards:
        for info in shard.files:
            path = shard_file_path(format_dir, shard, info)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                raise LmdataError(
                    f"{path}: shard {shard.name} file is missing; run `lmdata verify` and re-ingest "
                    "(--overwrite)"
                ) from None
            if size != info.bytes:
                raise LmdataError(
                    f"{path}: shard {shard.name} file has {size} bytes, the manifest says {info.bytes}; "
                    "the store is damaged (run `lmdata verify`; re-ingest with --overwrite)"
                )
