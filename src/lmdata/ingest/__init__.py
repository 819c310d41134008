"""The ingest: raw documents -> tokens -> shards in every format -> manifest.

``job.py`` is the job (checks, plan, lock, engine by name, manifest); ``encode.py`` and
``shards.py`` are the engine-neutral core; ``local.py`` and ``ray.py`` are the engines
(each imports the core, never the other); ``output.py`` owns the store directory (lock,
plan, refuse/resume/undo). ``ingest`` is the way in.
"""

from __future__ import annotations

from lmdata._lazy import lazy_exports

_EXPORTS = {
    "ingest": "lmdata.ingest.job",
    "IngestResult": "lmdata.ingest.job",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
