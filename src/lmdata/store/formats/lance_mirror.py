"""A remote Lance split copied to the machine in the background, then read locally.

A take through Lance's object store pays a request per fragment it touches, every batch of
every epoch (on moto, which reads a whole object for each ranged GET: ~0.05 M tok/s). A
shuffled epoch touches every fragment within its first batches anyway, so the reader starts
a copy of the split from its first read: one daemon thread downloads the dataset's commit
log (``_versions/``, ``_transactions/``) and each fragment's data file, streamed to disk
and checked against the manifest's sha256, into ``$LMDATA_CACHE_DIR/lance/<key>`` (the key:
the split's URI and its data files' sha256s, so a re-ingested store never meets a stale
copy), then writes a ``complete`` marker. Until then batches are taken remotely; from the
next batch after it, from the copy (``LanceReader._take``). Processes of one machine share
it: one copies while the others wait on its lock, reading remotely meanwhile.

The copy is made only when the split's data files fit ``LMDATA_LANCE_CACHE_BYTES`` (default
64 GiB; 0: never) and leave a tenth of the disk free (``io.cache.fits_on_disk``), least
recently used copies of other splits removed to make room. A copy
that fails (an object that does not match its sha256, a full disk) is left unfinished and
the reader stays remote, where every row is still checked against its CRC-32.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from lmdata.io.atomic import temp_path
from lmdata.io.cache import cache_root, fits_on_disk, held_lock, tree_bytes
from lmdata.store.formats.parquet_cache import cache_budget
from lmdata.store.protocol import ShardInfo

COMPLETE = "complete"  # the marker written last
COMMIT_LOG = ("_versions/", "_transactions/")
_CHUNK = 8 << 20


class LanceMirror:
    """The machine's copy of one remote Lance split (see the module docstring)."""

    def __init__(self, format_dir: Any, shards: list[ShardInfo], nbytes: int) -> None:
        self.source = format_dir  # the split's Lance dataset on object storage
        self.shards, self.nbytes = shards, nbytes  # nbytes: its data files
        key = hashlib.sha1("\n".join([format_dir.uri, *(s.files[0].sha256 for s in shards)]).encode()).hexdigest()
        self.root = cache_root() / "lance"
        self.local = self.root / key[:20]
        self._done = threading.Event()
        if (self.local / COMPLETE).is_file():
            self._done.set()
            os.utime(self.local / COMPLETE)  # its use, for eviction
        else:
            threading.Thread(target=self._run, name="lmdata-lance-mirror", daemon=True).start()

    @classmethod
    def start(cls, format_dir: Any, shards: list[ShardInfo]) -> "LanceMirror | None":
        """The mirror of this split, started; None when it does not fit the budget."""
        nbytes = sum(s.files[0].bytes for s in shards)
        if nbytes > cache_budget("lance") or not fits_on_disk(cache_root() / "lance", nbytes):
            return None
        return cls(format_dir, shards, nbytes)

    def ready(self) -> bool:
        return self._done.is_set()

    def _run(self) -> None:
        try:
            with held_lock(self.local / ".lock"):  # another process copying this split: wait for it
                if not (self.local / COMPLETE).is_file():
                    self._make_room()
                    self._copy()
            self._done.set()
        except Exception:  # noqa: BLE001 - the reader stays remote, every row still CRC-checked
            pass

    def _copy(self) -> None:
        data = {s.files[0].path: s.files[0] for s in self.shards}
        for listed in self.source.list(recursive=True):
            if listed.key.startswith(COMMIT_LOG):
                self._download(listed.loc, self.local / listed.key, None)
        for rel, info in data.items():
            target = self.local / rel
            if not (target.is_file() and target.stat().st_size == info.bytes):
                self._download(self.source / rel, target, info.sha256)
        (self.local / COMPLETE).write_text("")

    def _download(self, source: Any, target: Path, sha256: str | None) -> None:
        """``source`` streamed to ``target`` (tmp + rename), refused unless it matches ``sha256``."""
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp, digest = temp_path(target), hashlib.sha256()
        try:
            with source.open_stream() as src, open(tmp, "wb") as dst:
                while chunk := src.read(_CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
            if sha256 is not None and digest.hexdigest() != sha256:
                raise ValueError(f"{source}: does not match its sha256 in the manifest")
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def _make_room(self) -> None:
        """Remove the least recently used copies of other splits until this one fits the budget."""
        budget, others = cache_budget("lance"), []
        for d in self.root.iterdir():
            if d != self.local and (d / COMPLETE).is_file():
                others.append(((d / COMPLETE).stat().st_mtime, tree_bytes(d), d))
        total = self.nbytes + sum(size for _, size, _ in others)
        for _, size, d in sorted(others):
            if total <= budget:
                break
            shutil.rmtree(d, ignore_errors=True)
            total -= size
