"""``lmdata batch RUN_OR_CHECKPOINT --step N [--rank R]``: the documents behind one step's batch.

Nothing is logged during training for this: the loader's order is a function of (seed, epoch,
position) (data/loader.py), so a checkpoint's loader state and the run's config recompute
it. Step ``N`` (``metrics.jsonl``'s step: the N-th optimizer step) reads ``grad_accum``
batches per rank; from a checkpoint at step ``S`` they are the batches after the next
``(N - 1 - S) * grad_accum`` the saved loader would hand out (``TokenLoader.upcoming``).
The order comes from the newest checkpoint at or before step ``N - 1`` (or the run's start
before the first kept one); world size, ``--grad-accum`` and batch from the first checkpoint
at or after step ``N`` (the process that trained step N, an elastic resume included), else
the newest. A sample ``k`` of a split is its tokens ``[k * L, k * L + L + 1)``; a mixture's
sample is first mapped to its source and that source's sample (``MixedDataset.locate``).
The tokens' documents come from the store's per-document index, their origin (input file
or object, byte offset or row) from its provenance table (store/provenance.py); a store
ingested before that table says the source is unknown. Worker count and format change
nothing: the order and the tokens are the same for every value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmdata.errors import LmdataError
from lmdata.train.checkpoint import CHECKPOINT_DIR, list_checkpoints, read_checkpoint, step_of


@dataclass
class Doc:
    doc_id: int
    source: str | None  # input path or URI; None: the store does not record it
    offset: int | None
    unit: str  # "byte" or "row"


@dataclass
class Sequence:
    micro: int  # micro-batch of the step (0 .. grad_accum - 1)
    row: int  # row within that micro-batch
    sample: int  # index in the run's training dataset (the mixture's, with --mix)
    store: str
    split: str
    token_start: int  # first token of the window in the split's stream
    tokens: np.ndarray  # the window: L + 1 ids (inputs are the first L, targets the last L)
    docs: list[Doc] = field(default_factory=list)
    text: str = ""  # the window's first characters, decoded


@dataclass
class StepBatch:
    step: int
    rank: int
    world_size: int
    grad_accum: int
    epoch: int
    first_batch: int  # this rank's batch index in its epoch of the step's first micro-batch
    checkpoint: Path | None  # the loader state recomputed from (None: the run's start)
    sequences: list[Sequence]


def _checkpoints(target: str | Path) -> list[Path]:
    target = Path(target)
    if target.is_file():
        step_of(target)  # one line for a file that is not a ckpt-*.pt
        return [target]
    found = list_checkpoints(target / CHECKPOINT_DIR) or list_checkpoints(target)
    if not found:
        raise LmdataError(f"{target}: no checkpoints (ckpt-*.pt) here or in {target / CHECKPOINT_DIR}; "
                          "give a training --out folder or a checkpoint file")
    return found


def _datasets(meta: dict[str, Any]) -> tuple[Any, list[tuple[Any, str, str]]]:
    """The run's training dataset and its parts (dataset, store path, split): the mixture's sources, or one."""
    from lmdata.store import open_store

    cfg, seq_len = meta.get("config") or {}, int(meta["seq_len"])
    fmt = cfg.get("format") or None
    try:
        if meta.get("mix"):
            from lmdata.data.mixed import MixedDataset

            parts = [(open_store(s).dataset(sp, seq_len, format=fmt), s, sp) for s, sp, _ in meta["mix"]]
            mixed = MixedDataset([(d, w) for (d, _, _), (_, _, w) in zip(parts, meta["mix"])], seed=int(cfg.get("seed", 0)))
            return mixed, parts
        ds = open_store(meta["store"]).dataset(meta["split"], seq_len, format=fmt)
    except LmdataError as exc:
        raise LmdataError(f"{exc} (the store the run trained on, recorded in its checkpoint: restore it there)") from None
    return ds, [(ds, meta["store"], meta["split"])]


def _loader_at(ckpt: Path, step: int, rank: int) -> tuple[Any, dict, list, int, Path | None]:
    """(the run's meta, loader, parts, batches to skip, checkpoint used) for step ``step``."""
    from lmdata.data.loader import make_loader

    ckpts = _checkpoints(ckpt)
    before = [c for c in ckpts if step_of(c) <= step - 1]
    used = before[-1] if before else None
    # the settings of the process that trained step N: the first checkpoint it saved (an elastic
    # resume changes world size and --grad-accum), else the newest; the order from ``used``
    settings = next((c for c in ckpts if step_of(c) >= step), ckpts[-1])
    meta = read_checkpoint(settings)["meta"]
    payload = read_checkpoint(used) if used is not None else None
    world, accum = int(meta.get("world_size") or 1), int(meta.get("grad_accum") or 1)
    if not 0 <= rank < world:
        raise LmdataError(f"--rank {rank}: the run had {world} rank(s) at step {step}; use --rank 0..{world - 1}")
    cfg = meta.get("config") or {}
    per_step = int(meta["batch_size"]) * accum * int(meta["seq_len"]) * world
    planned = -(-int(cfg["tokens"]) // per_step) if cfg.get("tokens") else int(cfg.get("steps") or step)
    if step > planned:
        raise LmdataError(f"--step {step}: the run trains {planned} steps; use --step 1..{planned}")
    dataset, parts = _datasets(meta)
    loader = make_loader(dataset, int(meta["batch_size"]), num_workers=0, seed=int(cfg.get("seed", 0)),
                         rank=rank, world_size=world, batches_per_read=1)
    start = 0
    if payload is not None:  # another world size: every rank continues from rank 0's state (elastic)
        states = payload["loader"]
        loader.load_state_dict(states[rank] if len(states) == world else states[0])
        start = int(payload["step"])
    return meta, loader, parts, (step - 1 - start) * accum, used


def step_batch(target: str | Path, step: int, rank: int = 0, chars: int = 60) -> StepBatch:
    """The sequences rank ``rank`` trained on at step ``step`` of the run (or checkpoint) ``target``."""
    from lmdata.train.sample import load_tokenizer

    if step < 1:
        raise LmdataError(f"--step {step}: steps count from 1 (metrics.jsonl's step)")
    meta, loader, parts, skip, used = _loader_at(target, step, rank)
    accum, seq_len = int(meta.get("grad_accum") or 1), int(meta["seq_len"])
    batches = loader.upcoming(skip, accum)
    tok = load_tokenizer(used or _checkpoints(target)[0], meta)
    lookups: dict[int, tuple[Any, Any]] = {}  # part -> (token offsets -> docs, their origins)
    sequences = []
    for micro, (_, _, indices) in enumerate(batches):
        if hasattr(loader.dataset, "locate"):  # a mixture: (source, that source's sample)
            src, local = loader.dataset.locate(indices)
        else:
            src, local = np.zeros(len(indices), dtype=np.int64), np.asarray(indices)
        for row, (k, s, j) in enumerate(zip(np.asarray(indices).tolist(), src.tolist(), local.tolist())):
            ds, store, split = parts[s]
            if s not in lookups:
                lookups[s] = _lookups(store, split)
            sequences.append(_sequence(micro, row, k, ds, store, split, j * seq_len, lookups[s], tok, chars))
    epoch, first = batches[0][0], batches[0][1]
    return StepBatch(step, rank, int(meta.get("world_size") or 1), accum, epoch, first, used, sequences)


def _lookups(store: str, split: str) -> tuple[Any, Any]:
    from lmdata.inspect.tables import docs_at
    from lmdata.store import open_store
    from lmdata.store.provenance import origins

    st = open_store(store)
    return docs_at(st, split), origins(st, split)


def _sequence(micro: int, row: int, k: int, ds: Any, store: str, split: str, start: int,
              lookups: tuple[Any, Any], tok: Any, chars: int) -> Sequence:
    find, where = lookups
    tokens = ds.read(np.array([start], dtype=np.int64))[0]
    first, last = find(np.array([start, start + len(tokens) - 1])).tolist()
    rows = where.span(first, last - first + 1)
    if rows is None:
        docs = [Doc(d, None, None, "byte") for d in range(first, last + 1)]
    else:
        docs = [Doc(first + i, where.path(src), off, where.unit(src)) for i, (src, off) in enumerate(rows.tolist())]
    text = tok.decode([int(t) for t in tokens[:chars]])[:chars]
    return Sequence(micro, row, k, store, split, start, tokens, docs, text)


def format_step_batch(sb: StepBatch) -> str:
    """The table ``lmdata batch`` prints: one row per (sequence, document), the window's text on its first."""
    from lmdata.store.provenance import UNKNOWN

    head = (f"step {sb.step}, rank {sb.rank} of {sb.world_size}: {len(sb.sequences)} sequences "
            f"({sb.grad_accum} micro-batch{'es' if sb.grad_accum > 1 else ''} from epoch {sb.epoch}, batch "
            f"{sb.first_batch}), recomputed from {sb.checkpoint or 'the run start'}")
    one_store = len({q.store for q in sb.sequences}) == 1
    rows = [("seq", "micro", "sample", "split", "tokens", "doc", "source", "offset", "text")]
    for i, q in enumerate(sb.sequences):
        for n, d in enumerate(q.docs):
            rows.append((str(i), str(q.micro), str(q.sample), q.split if one_store else f"{q.store}:{q.split}",
                         f"{q.token_start}-{q.token_start + len(q.tokens)}", str(d.doc_id),
                         d.source if d.source is not None else UNKNOWN,
                         f"{d.unit} {d.offset}" if d.offset is not None else "-", repr(q.text) if n == 0 else ""))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    return "\n".join([head] + [("  ".join(v.ljust(w) for v, w in zip(r, widths)) + "  " + r[-1]).rstrip()
                               for r in rows])
