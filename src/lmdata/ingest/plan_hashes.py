"""The inputs' checksums in an ingest plan: whether a plan was written before they were known, and
a plan's inputs hashed again by the algorithm an older plan recorded them with (``--resume``)."""

from __future__ import annotations

import copy
from typing import Any

from lmdata.io import digests
from lmdata.io.location import location
from lmdata.sources import describe


def hashed_as_before(old: Any, plan: dict[str, Any]) -> dict[str, Any]:
    """``plan`` with each input that ``old`` recorded by another algorithm (a store an earlier lmdata started:
    sha256) hashed again by that one, where its path and size match, so that ``--resume`` compares like with like."""
    try:
        redo = [(name, i, digests.recorded(was)[0]) for name, split in plan["splits"].items()
                for i, (was, now) in enumerate(zip(old["splits"][name]["sources"], split["sources"]))
                if digests.recorded(was)[0] != digests.recorded(now)[0] and
                (was["path"], was["bytes"]) == (now["path"], now["bytes"])]
    except (AttributeError, KeyError, TypeError):
        return plan  # a plan of another shape: compared as it is
    if not redo:
        return plan
    plan = copy.deepcopy(plan)
    for name, i, algo in redo:
        sources = plan["splits"][name]["sources"]
        sources[i] = {**describe(location(sources[i]["path"]), algo=algo), "path": sources[i]["path"]}
    return plan


def pending(plan: Any) -> bool:
    """Whether a plan read back was written before its inputs were hashed (a checksum is null)."""
    try:
        return any(_unhashed(src) for split in plan["splits"].values() for src in split["sources"])
    except (AttributeError, KeyError, TypeError):
        return False


def _unhashed(source: Any) -> bool:
    try:
        return digests.recorded(source)[1] is None
    except KeyError:
        return False  # no checksum at all: not a pending plan's record
