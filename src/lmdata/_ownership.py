"""Which files lmdata may replace or delete: only those it wrote itself.

A directory is lmdata's only if it carries lmdata's own marker -- a store manifest or
ingest plan that parses as ours, a tokenizer metadata file of ours, or the ``lmdata.json``
that ``train --out`` and ``bench --out`` write first -- never because a file there has a
familiar name (a web app's ``manifest.json``, a Hugging Face ``tokenizer.json``). Even
then a command touches only the names its own layout uses; anything else present is a
user's file, and the command refuses, naming the directory and those files.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Callable, Iterable

from lmdata.errors import LmdataError

MARKER = "lmdata.json"
MARKER_VERSION = 1
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-[0-9A-Za-z_]+$")  # our tmp + rename names: .NAME.tmp-PID


def temp_of(name: str) -> str | None:
    """The name a hidden temporary (``.NAME.tmp-PID``) stands for; None for any other name."""
    m = _TEMP.match(name)
    return m.group("name") if m else None


def foreign_entries(directory: Path, owned: Callable[[str], bool]) -> list[str]:
    """The entries of ``directory`` that ``owned`` does not claim (a temporary of an owned name is owned)."""
    out = []
    for p in sorted(Path(directory).iterdir()):
        base = temp_of(p.name)
        if not (owned(p.name) or (base is not None and owned(base))):
            out.append(p.name)
    return out


def describe_foreign(directory: Path, names: Iterable[str], limit: int = 5) -> str:
    """``a, b, c and 4 more``: the foreign names for a one-line refusal."""
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def refuse_foreign(directory: Path, foreign: list[str], flag: str, what: str) -> None:
    """Raise the one-line refusal when ``foreign`` is not empty."""
    if foreign:
        raise LmdataError(
            f"{flag} {directory}: holds files lmdata did not write ({describe_foreign(directory, foreign)}); "
            f"lmdata never replaces or deletes them -- choose another {flag}, or move them out to reuse it as {what}"
        )


def read_marker(directory: Path) -> dict | None:
    """The parsed ``lmdata.json`` of ``directory`` if it is ours, else None."""
    try:
        meta = json.loads((Path(directory) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(meta, dict) and meta.get("format") == "lmdata-output" and isinstance(meta.get("kind"), str) \
            and meta.get("version") == MARKER_VERSION:
        return meta
    return None


def claim_output_dir(directory: Path, kind: str, names: frozenset[str], *, flag: str,
                     legacy: Callable[[Path], bool] = lambda d: False) -> Path:
    """Make ``directory`` this command's output: missing, empty, or already a ``kind`` output of ours.

    ``names`` are the entries the command writes there; any other entry is refused. A
    directory without the marker is taken only when empty, or when ``legacy(directory)``
    recognises output written before the marker existed. Writes the marker and returns the path.
    """
    check_output_dir(directory, kind, names, flag=flag, legacy=legacy)
    return mark(directory, kind)


def check_output_dir(directory: Path, kind: str, names: frozenset[str], *, flag: str,
                     legacy: Callable[[Path], bool] = lambda d: False) -> None:
    """``claim_output_dir``'s refusals, nothing created: a command that checks its other inputs after
    this claims the directory once they pass (no half-made output left by a bad input)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise LmdataError(f"{flag} {directory}: exists and is not a directory; choose another {flag}")
    if directory.is_dir() and any(directory.iterdir()):
        check_owned_dir(directory, kind, names, flag=flag, legacy=legacy)


def mark(directory: Path, kind: str) -> Path:
    """Create ``directory`` (already checked) and give it the ``lmdata.json`` of ``kind`` once."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if read_marker(directory) is None:
        write_marker(directory, kind)
    return directory


def check_owned_dir(directory: Path, kind: str, names: frozenset[str], *, flag: str,
                    legacy: Callable[[Path], bool] = lambda d: False) -> None:
    """Refuse unless the existing, non-empty ``directory`` is a ``kind`` output holding only ``names``."""
    directory = Path(directory)
    mine = names | {MARKER}
    refuse_foreign(directory, foreign_entries(directory, mine.__contains__), flag, f"a {kind} output")
    meta = read_marker(directory)
    if meta is not None and meta["kind"] != kind:
        raise LmdataError(f"{flag} {directory}: is lmdata {meta['kind']} output, not {kind} output; "
                          f"choose another {flag}")
    if meta is None and not legacy(directory):
        present = describe_foreign(directory, sorted(p.name for p in directory.iterdir()))
        raise LmdataError(
            f"{flag} {directory}: is not empty and carries no lmdata marker ({MARKER}); its files ({present}) "
            f"may be yours, so lmdata will not replace them -- choose another {flag}"
        )


def write_marker(directory: Path, kind: str) -> None:
    """Write ``lmdata.json`` (tmp + rename) so later runs know the directory is ours."""
    path = Path(directory) / MARKER
    tmp = path.with_name(f".{MARKER}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"format": "lmdata-output", "kind": kind, "version": MARKER_VERSION}) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)
