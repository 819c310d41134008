"""The ingest's output directory: lock, refuse-or-resume, tokenizer copy, ingest plan.

An ingest owns ``<store>`` while it holds the file lock ``<store>/.lock`` (``filelock``; released
by the kernel when the process dies, so a SIGKILLed ingest never leaves a stale lock).
Before any shard it writes ``<store>/ingest-plan.json``: everything that decides the
bytes of the store (tokenizer hash, dtype, shard size, formats, each split's sources
with their checksums and how they are cut). ``--resume`` continues only a store whose plan
is identical, which is what makes a resumed store equal to an uninterrupted one. A fresh
ingest writes it with the checksums null and rewrites it once its inputs are hashed
(``BackgroundHashes``), so encoding does not wait for a pass over the input; a store whose
plan is still pending is refused by ``--resume`` (``--overwrite`` starts it over).

States of ``<store>`` and what each flag does::

    missing / empty            -> start
    our manifest.json present  -> refused; --overwrite replaces, --resume re-checks and finishes
    our ingest-plan.json, no manifest (an interrupted ingest)
                               -> refused; --resume continues, --overwrite starts over
    anything else              -> refused even with --overwrite (not ours to delete)

"Ours" means the manifest or plan parses as lmdata's (``store_layout``), never that a file
is *named* ``manifest.json``; and even in our store, a name that no ingest of its layout
writes (``foreign_files``: a user's ``README.md``, ``.git/``, a stray file among the shards)
makes ``--overwrite`` and ``--resume`` refuse, naming it, rather than delete or mix with it.

When an ingest fails on bad input (an ``LmdataError``), what it wrote cannot be resumed:
fixing the input changes its checksum in the plan. So a run that started from nothing
(``<store>`` missing or empty, or emptied by ``--overwrite``) removes everything it wrote
(``remove_output``) and the fixed input is simply rerun; a resumed store is left as it was
and the error says to rerun with ``--overwrite``. A crash (SIGKILL, Ctrl-C, a bug) removes
nothing: its partial store is what ``--resume`` continues. ``ResumableError`` is an error
after which the partial store is worth keeping (it says ``--resume``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any, Callable

from lmdata.io import atomic
from lmdata.io.atomic import fsync_dir
from lmdata._ownership import describe_foreign, foreign_entries, refuse_foreign
from lmdata.errors import LmdataError
from lmdata.sources import describe, expand
from lmdata.ingest.plan_hashes import hashed_as_before, pending
from lmdata.io import digests
from lmdata.store.layout import LOCK_NAME, MANIFEST_NAME, PLAN_NAME, PROVENANCE_DIR, TOKENIZER_DIR
from lmdata.store.manifest import read_manifest
from lmdata.store.readlock import holders

_PLAN_KEYS = {"tokenizer_hash", "dtype", "shard_tokens", "formats", "splits"}
OWNED_PROVENANCE = re.compile(r"origins-\d{5,}\.npy|_shards")  # store/provenance.py's names
_PROBE = re.compile(r"\.write-test-\d+")  # open_output's writability probe


class ResumableError(LmdataError):
    """An ingest error whose partial store ``--resume`` can continue: never removed on failure."""


def missing_root(out: Path) -> Path | None:
    """The first directory on the way to ``out`` that does not exist yet (what ``open_output``
    will create, and a failed run may delete); None when ``out`` exists."""
    out = Path(out).absolute()
    if out.exists() or out.is_symlink():
        return None
    root = out
    while not root.parent.exists() and root.parent != root:
        root = root.parent
    return root


def is_empty(out: Path) -> bool:
    """Nothing in ``out`` but our lock: a store this run starts from nothing."""
    return not any(p.name != LOCK_NAME for p in Path(out).iterdir())


def remove_output(out: Path, created: Path | None) -> None:
    """Undo a failed run that started from nothing: delete ``created`` (the directories it made),
    or else everything inside ``out``. Called while holding the lock, so no other ingest writes there."""
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)
        return
    for p in Path(out).iterdir():
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
    fsync_dir(Path(out))


def open_output(out: Path) -> Path:
    """Create ``out`` (and parents) or explain why it cannot be written."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise LmdataError(f"--out {out}: exists and is not a directory; choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise LmdataError(f"output directory {out} is not writable ({exc.strerror}); choose another --out") from None
    return out


class StoreLock:
    """The store's lock, held until ``close`` (``filelock``: flock on POSIX, msvcrt on Windows;
    the operating system releases it when the process dies, so a killed ingest leaves no stale lock)."""

    def __init__(self, out: Path) -> None:
        from filelock import FileLock, Timeout

        self._lock = FileLock(str(Path(out) / LOCK_NAME), timeout=0)
        try:
            self._lock.acquire()
        except Timeout:
            readers = holders(Path(out) / LOCK_NAME, "READ")
            if readers:  # the readers' lock (``store.readlock``): a training run, verify, sql... reads it
                mine = " (this process)" if readers == [os.getpid()] else ""
                raise LmdataError(
                    f"{out}: the store is being read right now by pid {', '.join(map(str, readers))}{mine} "
                    f"(readers' lock {Path(out) / LOCK_NAME}); replacing it would change the data under that "
                    "reader: stop the reader first, or ingest into another --out and point the job at it"
                ) from None
            raise LmdataError(
                f"{out}: another ingest is writing this store right now (lock {Path(out) / LOCK_NAME} is held); "
                "wait for it to finish or choose another --out"
            ) from None

    def close(self) -> None:
        self._lock.release()


def lock(out: Path) -> StoreLock:
    """Hold the store's lock for this process; a second ingest into ``out`` is refused."""
    return StoreLock(out)


def claim(out: Path, *, resume: bool, overwrite: bool) -> StoreLock:
    """Lock ``out`` and ``prepare`` it; a refusal leaves ``out`` as it was (no lock file left in a user's folder)."""
    had_lock = (Path(out) / LOCK_NAME).exists()
    fh = lock(out)
    try:
        prepare(out, resume=resume, overwrite=overwrite)
    except BaseException:
        if not had_lock:
            (Path(out) / LOCK_NAME).unlink(missing_ok=True)
        fh.close()
        raise
    return fh


def store_layout(out: Path) -> dict[str, set[str]] | None:
    """Each split's formats as the store's own marker names them (its manifest, else its ingest
    plan); None when ``out`` carries no marker of ours (a file merely *named* manifest.json is not one)."""
    out = Path(out)
    if (out / MANIFEST_NAME).is_file():
        try:
            manifest = read_manifest(out)
        except LmdataError:
            manifest = None
        if manifest is not None:
            return {name: set(s.formats) for name, s in manifest.splits.items()}
    try:
        plan = json.loads((out / PLAN_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(plan, dict) and set(plan) == _PLAN_KEYS and isinstance(plan["splits"], dict)
            and isinstance(plan["formats"], list) and all(isinstance(f, str) for f in plan["formats"])):
        return None
    return {name: set(plan["formats"]) for name in plan["splits"] if isinstance(name, str)}


def foreign_files(out: Path, layout: dict[str, set[str]]) -> list[str]:
    """Paths under ``out`` (relative) that no ingest of this layout writes: a user's files."""
    out = Path(out)
    top = {MANIFEST_NAME, PLAN_NAME, LOCK_NAME, TOKENIZER_DIR, *layout}
    foreign = [n for n in foreign_entries(out, lambda n: n in top or _PROBE.fullmatch(n) is not None)]
    for split, formats in layout.items():
        if not (out / split).is_dir():
            continue
        foreign += [f"{split}/{n}" for n in foreign_entries(out / split, lambda n: n in formats or n == PROVENANCE_DIR)]
        for fmt in [*formats, PROVENANCE_DIR]:
            owned = _owned(fmt)
            if owned is not None and (out / split / fmt).is_dir():
                foreign += [f"{split}/{fmt}/{n}" for n in foreign_entries(out / split / fmt, owned.fullmatch)]
    return foreign


def layout_from(manifest: dict | None, plan: dict | None) -> dict[str, set[str]] | None:
    """``store_layout`` from already-parsed manifest / plan JSON (an object store's: no directories)."""
    if isinstance(manifest, dict) and manifest.get("format", "lmdata-store") == "lmdata-store" \
            and isinstance(manifest.get("splits"), dict):
        splits = manifest["splits"]
        if all(isinstance(v, dict) and isinstance(v.get("formats"), dict) for v in splits.values()):
            return {name: set(v["formats"]) for name, v in splits.items()}
    if isinstance(plan, dict) and set(plan) == _PLAN_KEYS and isinstance(plan["splits"], dict) \
            and isinstance(plan["formats"], list) and all(isinstance(f, str) for f in plan["formats"]):
        return {name: set(plan["formats"]) for name in plan["splits"] if isinstance(name, str)}
    return None


def foreign_keys(keys: list[str], layout: dict[str, set[str]]) -> list[str]:
    """``foreign_files`` for the relative object names of a prefix on object storage."""
    top = {MANIFEST_NAME, PLAN_NAME, TOKENIZER_DIR, *layout}
    foreign = []
    for key in keys:
        parts = key.split("/")
        ok = parts[0] in top and (parts[0] not in layout or len(parts) > 2 and
                                  (parts[1] in layout[parts[0]] or parts[1] == PROVENANCE_DIR))
        if ok and parts[0] in layout:
            owned = _owned(parts[1])
            ok = owned is None or owned.fullmatch(parts[2]) is not None
        if ok and parts[0] in (MANIFEST_NAME, PLAN_NAME):
            ok = len(parts) == 1
        if not ok:
            foreign.append(key)
    return foreign


def _owned(table: str) -> Any:
    """The names a format's writer (or the provenance writer) creates in its directory; None: any."""
    from lmdata.store.registry import get_format

    if table == PROVENANCE_DIR:
        return OWNED_PROVENANCE
    return getattr(get_format(table).writer, "OWNED", None)


def prepare(out: Path, *, resume: bool, overwrite: bool) -> None:
    """Refuse or clear an existing store according to the flags (see the module docstring)."""
    if resume and overwrite:
        raise LmdataError("--resume and --overwrite exclude each other; pick one")
    entries = [p for p in Path(out).iterdir() if p.name != LOCK_NAME]
    if not entries:
        return
    layout = store_layout(out)
    if layout is None:
        raise LmdataError(
            f"--out {out} is not empty and holds no lmdata store; refusing to write or delete there (no "
            f"manifest.json or ingest-plan.json of lmdata's; it holds "
            f"{describe_foreign(out, sorted(p.name for p in entries))}); choose another --out"
        )
    refuse_foreign(Path(out), foreign_files(out, layout), "--out", "a store")
    if overwrite:
        for p in entries:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        fsync_dir(Path(out))
        return
    if resume:
        return
    if (Path(out) / MANIFEST_NAME).is_file():
        raise LmdataError(f"{out} already holds a store; pass --overwrite to replace it")
    raise LmdataError(
        f"{out} holds the partial output of an interrupted ingest; pass --resume to continue it "
        "or --overwrite to start over"
    )


def read_tokenizer_files(tokenizer_dir: Path) -> dict[str, bytes]:
    """The tokenizer directory's files, read before ``prepare`` may clear the store (it can live there)."""
    return {p.name: p.read_bytes() for p in sorted(Path(tokenizer_dir).iterdir()) if p.is_file()}


def install_tokenizer(out: Path, files: dict[str, bytes], *, present: bool) -> Path:
    """``<store>/tokenizer``, written unless it is ``present`` (``check_tokenizer`` said so, and that it is
    the same tokenizer)."""
    dest = Path(out) / TOKENIZER_DIR
    if not present:
        atomic.write_dir(dest, files)
    return dest


def check_tokenizer(out: Path, tokenizer_dir: Path, tokenizer_hash: str, load: Any) -> bool:
    """Whether ``<store>/tokenizer`` is there (refused unless it is this tokenizer): before the plan is
    compared, so a resume with another tokenizer is told so in these words."""
    dest = Path(out) / TOKENIZER_DIR
    if not dest.exists():
        return False
    have = load(dest).hash
    if have != tokenizer_hash:
        raise LmdataError(
            f"tokenizer {tokenizer_dir} (hash {tokenizer_hash[:19]}) does not match the store being resumed "
            f"(hash {have[:19]} in {dest}); pass the tokenizer the store was started with, or --overwrite"
        )
    return True


class BackgroundHashes:
    """Every input of ``splits`` hashed on a thread from now on (xxh128 releases the GIL).

    ``describe_all`` (what ``make_plan`` calls) waits for the records. A fresh ingest does not
    wait: it writes a pending plan (``pending_records``: each source's path and size, its checksum
    null) before any shard and starts encoding, and ``write_plan_when_hashed`` rewrites the plan
    whole on a thread of its own once the hashes are in. Waiting for them had put a pass over the
    input ahead of the first encoded batch: 0.27 s of a 503 MB memmap ingest's ~4 s, ~8 s for
    10 GB. A daemon thread, stopped by ``stop()``: an ingest that fails first never waits for a
    large input's hash, and its plan is not rewritten after the failure."""

    def __init__(self, splits: dict[str, Any]) -> None:
        self.files = {str(p): p for s in splits.values() for p in expand(s.spec.paths)}
        self.records: dict[str, Any] = {}
        self.error: BaseException | None = None
        self._stop, self._done = threading.Event(), threading.Event()
        self._plan: dict[str, Any] | None = None
        self._plan_error: BaseException | None = None
        self._planner: threading.Thread | None = None
        threading.Thread(target=self._run, name="lmdata-hash", daemon=True).start()

    def write_plan_when_hashed(self, out: Path, build: Callable[[Callable], dict[str, Any]]) -> None:
        """Once every input is hashed, ``build(self.describe_all)`` written as ``out``'s plan (replacing the
        pending one); ``final_plan`` waits for it."""
        def run() -> None:
            try:
                self._done.wait()
                if not self._stop.is_set():
                    plan = build(self.describe_all)
                    if not self._stop.is_set():
                        write_plan(out, plan)
                        self._plan = plan
            except BaseException as exc:  # re-raised by final_plan
                self._plan_error = exc

        self._planner = threading.Thread(target=run, name="lmdata-plan", daemon=True)
        self._planner.start()

    def final_plan(self) -> dict[str, Any]:
        """The plan with every input's checksum, once written (``write_plan_when_hashed``)."""
        assert self._planner is not None, "write_plan_when_hashed first"
        self._planner.join()
        if self._plan_error is not None:
            raise self._plan_error
        if self._plan is None:
            raise LmdataError("the ingest was stopped before its inputs were hashed")
        return self._plan

    def _run(self) -> None:
        try:
            for key, path in self.files.items():
                self.records[key] = describe(path, self._stop)
        except BaseException as exc:  # re-raised where the plan asks for the records
            self.error = exc
        finally:
            self._done.set()

    def describe_all(self, files: list[Any]) -> list[dict[str, object]]:
        self._done.wait()
        if self.error is not None:
            raise self.error
        return [self.records[str(p)] for p in files]

    def stop(self) -> None:
        """Stop hashing; a plan being written is finished first, none is written after."""
        self._stop.set()
        if self._planner is not None:
            self._planner.join()


def pending_records(files: list[Any]) -> list[dict[str, object]]:
    """The plan's records of ``files`` before they are hashed: path and size, checksum null."""
    return [{"path": str(p), "bytes": p.size(), digests.WRITE_ALGO: None} for p in files]


def make_plan(splits: dict[str, Any], tokenizer_hash: str, dtype: str, shard_tokens: int,
              formats: list[str], describe_all: Any = None) -> dict[str, Any]:
    """The plan: everything that decides the store's bytes (``splits``: name -> ``SplitSource``).

    ``describe_all(files)``: the files' ``sources.describe`` records, in order (an engine may hash
    them where they are read: ``RayEngine.describe_all``); by default this process reads them."""
    describe_all = describe_all or (lambda files: [describe(p) for p in files])
    return {
        "tokenizer_hash": tokenizer_hash, "dtype": dtype, "shard_tokens": shard_tokens, "formats": formats,
        "splits": {
            name: {
                "sources": describe_all(expand(s.spec.paths)),
                "kind": s.spec.kind, "separator": s.spec.separator, "text_field": s.spec.text_field,
                "errors": s.spec.errors, "documents": [s.start, s.stop],
            }
            for name, s in splits.items()
        },
    }


def check_plan(out: Path, plan: dict[str, Any]) -> None:
    """Write the plan, or check that a resumed store was started with exactly this plan."""
    path = Path(out) / PLAN_NAME
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            raise LmdataError(f"{path}: unreadable ingest plan; start over with --overwrite") from None
        if not (pending(old) and not _has_shards(out)):  # stopped before any shard: nothing to check against
            same_plan(old, plan, str(out))
            return
    write_plan(out, plan)


def _has_shards(out: Path) -> bool:
    """Whether the run that wrote ``out``'s plan wrote any shard file (a split's directory holds a file)."""
    return any(f.is_file() for d in Path(out).iterdir() if d.is_dir() and d.name != TOKENIZER_DIR
               for f in d.rglob("*"))


def same_plan(old: Any, plan: dict[str, Any], where: str) -> None:
    """Refuse to go on with the store at ``where`` unless it was started with exactly ``plan``."""
    if pending(old):
        raise LmdataError(
            f"{where} was interrupted before its inputs were hashed ({PLAN_NAME} has no checksum of them), so "
            "nothing tells that its shards came from these inputs; start over with --overwrite"
        )
    plan = hashed_as_before(old, plan)
    if old != plan:
        raise LmdataError(
            f"{where} was started with different settings ({_plan_difference(old, plan)}); rerun with the "
            "original inputs and options, or start over with --overwrite"
        )


_FLAGS = {"shard_tokens": "--shard-tokens", "formats": "--format", "kind": "--kind", "separator": "--separator",
          "text_field": "--text-field", "errors": "--errors"}


def _plan_difference(old: Any, new: dict[str, Any]) -> str:
    """What differs between a store's plan and this run's, in the terms of the command line (a changed
    holdout had read ``splits.train.documents[1]: 12150 vs 12160 differs``)."""
    try:
        for key, flag in _FLAGS.items():
            if key in new and old.get(key) != new[key]:
                return f"{flag} was {_short(old.get(key))}, now {_short(new[key])}"
        for key, flag in _FLAGS.items():
            for name, split in new["splits"].items():
                if key in split and name in old["splits"] and old["splits"][name].get(key) != split[key]:
                    return f"split {name!r}: {flag} was {_short(old['splits'][name].get(key))}, now {_short(split[key])}"
        if set(old["splits"]) != set(new["splits"]):
            return f"the splits were {sorted(old['splits'])}, now {sorted(new['splits'])}"
        for name, split in new["splits"].items():
            before = old["splits"][name]  # the inputs first: a changed input moves a holdout's span too
            paths = [s["path"] for s in before["sources"]], [s["path"] for s in split["sources"]]
            if paths[0] != paths[1]:
                return f"split {name!r}: its inputs were {_short(paths[0])}, now {_short(paths[1])}"
            for was, now in zip(before["sources"], split["sources"]):
                if was != now:
                    return (f"input {now['path']} changed since the ingest started ({was.get('bytes')} bytes then, "
                            f"{now.get('bytes')} now, or another checksum)")
            if before["documents"] != split["documents"]:
                return (f"split {name!r} took documents {_span(before['documents'])} of its input, this run "
                        f"{_span(split['documents'])}: a different --holdout")
    except (AttributeError, KeyError, TypeError, ValueError):
        pass  # a plan of another shape: its first difference, as it is
    return f"{_first_difference(old, new)} differs"


def _span(documents: Any) -> str:
    start, stop = documents
    return f"{start:,} to {'the end' if stop is None else f'{stop:,}'}"


def write_plan(out: Path, plan: dict[str, Any]) -> None:
    """``<out>/ingest-plan.json``, durably (a pending plan is replaced whole)."""
    atomic.write_bytes(Path(out) / PLAN_NAME, json.dumps(plan, indent=1).encode() + b"\n")


def _first_difference(a: Any, b: Any, where: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{where}.{key}" if where else key)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{where}[{i}]")
    return f"{where or 'plan'}: {_short(a)} vs {_short(b)}"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
