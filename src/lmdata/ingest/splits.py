"""A split's documents: a source's document stream, or a slice of it (the holdout).

``plan_splits`` turns ``--split``/``--input`` specs and an optional ``--holdout`` into each
split's ``SplitSource``: the last N documents of one split become another (e.g.
``validation``); counting them costs one read of the input, no tokenizing.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from lmdata.errors import LmdataError
from lmdata.io.location import Location
from lmdata.sources import SourceSpec, iter_documents


@dataclass(frozen=True)
class SplitSource:
    """A split's documents: the documents ``[start, stop)`` of ``spec``'s stream."""

    spec: SourceSpec
    start: int = 0
    stop: int | None = None


def _count_documents(spec: SourceSpec) -> int:
    return sum(1 for _ in iter_documents(spec))


def plan_splits(splits: dict[str, SourceSpec], holdout: tuple[str, str, int] | None = None) -> dict[str, SplitSource]:
    """Split specs (+ an optional holdout: the last N documents of one split form another)."""
    plan = {name: SplitSource(spec) for name, spec in splits.items()}
    if holdout is None:
        return plan
    src, dst, n = holdout
    if src not in plan:
        raise LmdataError(f"--holdout takes documents from split {src!r}, which is not among {', '.join(plan)}")
    if dst in plan:
        raise LmdataError(f"--holdout split {dst!r} already has its own inputs (--split {dst}=...); drop one of the two, "
                          "or hold out into another split (a pipeline's [ingest.holdout] to = NAME)")
    total = _count_documents(splits[src])
    if not 0 < n < total:
        raise LmdataError(f"--holdout {n}: split {src!r} has {total} documents; hold out between 1 and {total - 1}")
    plan[src] = SplitSource(splits[src], 0, total - n)
    plan[dst] = SplitSource(splits[src], total - n, total)
    return plan


def warn_repeated_inputs(files: dict[str, list[Location]]) -> None:
    """One warning line for an input file given twice in a split (its documents are ingested twice) or
    in two splits (a validation split that holds training documents). Either may be meant (repeating
    data to weight it), so it is said, not refused; ``--holdout`` carves a disjoint split from one input."""
    seen: dict[str, str] = {}
    for name, paths in files.items():  # each split's files, as ``sources.expand`` found them
        for path in map(str, paths):
            if path not in seen:
                seen[path] = name
            elif seen[path] == name:
                warnings.warn(f"input {path} is given twice in split {name!r}: its documents are ingested twice",
                              UserWarning, stacklevel=3)
            else:
                warnings.warn(f"input {path} is in splits {seen[path]!r} and {name!r}: they share its documents "
                              f"(--holdout N takes a disjoint split from one input)", UserWarning, stacklevel=3)
