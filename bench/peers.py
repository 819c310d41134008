"""lmdata's loader beside LitData and Mosaic Streaming, on the same token ids (issue 25 item 4).

    bash scripts/setup-peers.sh          # .venv-peers: lmdata + litdata 0.2.76 + mosaicml-streaming 0.13.0
    .venv-peers/bin/python bench/peers.py --readme bench/README.md
    .venv-peers/bin/python bench/peers.py --store /tmp/lmdata-peers/x32-s1048576 --repeat 2

The store is ``--corpus`` (../shared/corpus/english-prose.txt) tiled until it holds >= 180 M
tokens (32 tiles at vocab 8,192: the text repeats, so does the token stream), ingested once
into memmap, Parquet and Lance (``bench/scale.py``'s ``ensure_store``), or ``--store``. Its ids
are then converted, read back from the memmap store, into

- LitData as litgpt prepares pretraining text (``litgpt/data/text_files.py``,
  ``openwebtext.py``): ``optimize(fn=..., chunk_bytes="50MB", item_loader=TokensLoader(),
  num_workers=cpu_count - 1)``, ``fn`` yielding int32 tensors (litgpt's ``Tokenizer.encode``),
  read with ``StreamingDataset(item_loader=TokensLoader(block_size=1025), shuffle=True,
  drop_last=True)`` + ``StreamingDataLoader(batch_size=32, num_workers=w, drop_last=True)``;
- Mosaic MDS as llm-foundry's ``convert_dataset_hf.py --concat_tokens 1025`` writes it
  (``ConcatTokensDataset``: fixed 1,025-token samples, ``columns={"tokens": "bytes"}`` holding
  int64 ids, ``compression=None``, ``MDSWriter``'s default 64 MiB shards), read as
  ``StreamingTextDataset`` does (``np.frombuffer(sample["tokens"], np.int64)``) with
  ``StreamingDataset(local=..., shuffle=True, batch_size=32)`` (its defaults: ``py1e``,
  ``relaxed``, predownload 8 x batch) + torch ``DataLoader(batch_size=32, num_workers=w,
  drop_last=True, prefetch_factor=2, persistent_workers=True)``.

``pin_memory`` is off everywhere (no accelerator here). Every batch is 32 x 1,025 ids split
into int64 ``x, y`` [32, 1024] (litgpt's and llm-foundry's ``[:, :-1]`` / ``[:, 1:]``). Each
cell runs in a fresh process (``--repeat N``: best of N): first batch from the process's
start (imports included), steady tokens/s (input tokens; ``--warmup`` batches excluded, then
``--batches`` timed), PSS of the loader's processes. Resume: a fresh process reads
``RESUME_AT`` batches, saves the tool's state (lmdata/LitData: ``loader.state_dict()``;
Mosaic: ``dataset.state_dict(num_samples, from_beginning=False)``, what Composer saves) and
the next batch's hash; another fresh process loads the state and must hand out that batch.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()  # a cell's first batch counts from here (the process's start)

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Iterator  # noqa: E402

from common import (CACHED_TOKENIZER, CORPUS, compile_lmdata, ensure_tokenizer, replace_section,  # noqa: E402
                    steady_seconds, tree_pss_mb)
from scale import (tokens_per_tile, cache_env, decode_copies, read_from, ensure_store, n_shards,  # noqa: E402
                   n_tokens, warm_page_cache)

B, L = 32, 1024
MIN_TOKENS = 180e6
RESUME_AT = 13  # batches read before the state is saved: not a multiple of a read group or worker count
LMDATA = ("memmap", "parquet", "lance")
PEERS = ("litdata", "mosaic")
LIT_CHUNK = "50MB"  # litgpt's TextFiles (its OpenWebText recipe: 200MB)


# ---------------------------------------------------------------------------- the peers' imports


def import_mosaic() -> Any:
    """``streaming.base`` with the package's ``__init__`` skipped (it imports torchvision; see
    scripts/setup-peers.sh). Mosaic's own code runs unchanged."""
    import importlib.util
    import types

    if "streaming" not in sys.modules:
        spec = importlib.util.find_spec("streaming")
        pkg = types.ModuleType("streaming")
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        sys.modules["streaming"] = pkg
    import streaming.base as base

    return base


def _memmap_shards(store: str) -> Iterator[Any]:
    """The store's ids, one memmap shard at a time (numpy, the store's dtype)."""
    from lmdata.store import open_store

    reader = open_store(store).reader("train", "memmap")
    b = reader._shard_bounds
    for i in range(len(b) - 1):
        if b[i + 1] > b[i]:
            yield reader.windows(b[i:i + 1], int(b[i + 1] - b[i]))[0]


def _lit_shard(arg: tuple[str, int]) -> Iterator[Any]:
    """LitData's ``fn``: shard ``i`` of the store as one int32 tensor (TokensLoader concatenates items)."""
    import numpy as np
    import torch

    from lmdata.store import open_store

    reader = open_store(arg[0]).reader("train", "memmap")
    b, i = reader._shard_bounds, arg[1]
    yield torch.from_numpy(reader.windows(b[i:i + 1], int(b[i + 1] - b[i]))[0].astype(np.int32))


def convert(tool: str, store: str, out: str) -> None:
    """Write the store's ids as ``tool``'s dataset at ``out`` (run in a fresh process, timed)."""
    import numpy as np

    if tool == "litdata":
        from litdata import TokensLoader, optimize

        n = n_shards(Path(store))
        optimize(fn=_lit_shard, inputs=[(store, i) for i in range(n)], output_dir=out, chunk_bytes=LIT_CHUNK,
                 item_loader=TokensLoader(), num_workers=max(1, (os.cpu_count() or 2) - 1), verbose=False)
        return
    mds = import_mosaic()
    buf = np.zeros(0, np.int64)
    with mds.MDSWriter(out=out, columns={"tokens": "bytes"}, compression=None) as writer:
        for ids in _memmap_shards(store):  # ConcatTokensDataset: a running buffer cut into 1,025-id samples
            buf = np.concatenate([buf, ids.astype(np.int64)])
            n = len(buf) // (L + 1)
            for row in buf[:n * (L + 1)].reshape(n, L + 1):
                writer.write({"tokens": row.tobytes()})
            buf = buf[n * (L + 1):]


# ---------------------------------------------------------------------------- one loader per tool


class Loader:
    """One tool's shuffled B x (L + 1) batches as int64 ``(x, y)``, with its own state and resume."""

    def __init__(self, tool: str, path: str, workers: int, seed: int = 0):
        self.tool, self.workers = tool, workers
        if tool in LMDATA:
            from lmdata.data import make_loader
            from lmdata.store import open_store

            ds = open_store(path).dataset("train", L, format=tool)
            self.loader = make_loader(ds, B, num_workers=workers, seed=seed)
        elif tool == "litdata":
            from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

            if path.startswith("s3://"):  # obstore refuses plain http; the loopback endpoint is http (S3 is https)
                import litdata.streaming.downloader as downloader

                downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}
            remote = {"cache_dir": os.environ["PEERS_CACHE"] + "/litdata",  # s3://: LitData's own streaming
                      "storage_options": {"endpoint_url": os.environ["AWS_ENDPOINT_URL"]}} if path.startswith("s3://") else {}
            ds = StreamingDataset(input_dir=path, item_loader=TokensLoader(block_size=L + 1), shuffle=True,
                                  drop_last=True, seed=seed, **remote)
            self.loader = StreamingDataLoader(ds, batch_size=B, num_workers=workers, drop_last=True)
        else:
            import torch

            mds = import_mosaic()
            from streaming.base.util import clean_stale_shared_memory

            clean_stale_shared_memory()  # llm-foundry's scripts do this first
            where = ({"remote": path, "local": os.environ["PEERS_CACHE"] + "/mosaic"} if path.startswith("s3://")
                     else {"local": path})  # s3://: Mosaic's own download (S3_ENDPOINT_URL) into a local cache
            self.dataset = _mosaic_tokens(mds)(shuffle=True, batch_size=B, shuffle_seed=seed + 9176, **where)
            extra = dict(prefetch_factor=2, persistent_workers=True) if workers else {}
            self.loader = torch.utils.data.DataLoader(self.dataset, batch_size=B, num_workers=workers,
                                                      drop_last=True, **extra)
        self.read = 0
        self._it: Any = None

    def __next__(self) -> tuple[Any, Any]:
        if self._it is None:
            self._it = iter(self.loader)
        batch = next(self._it)
        self.read += 1
        if self.tool in LMDATA:
            return batch
        return batch[:, :-1].long(), batch[:, 1:].long()

    def state(self) -> Any:
        if self.tool == "mosaic":  # what Composer saves: samples seen by this run, from_beginning=False
            return self.dataset.state_dict(self.read * B, False)
        return self.loader.state_dict()

    def resume(self, state: Any) -> None:
        (self.dataset if self.tool == "mosaic" else self.loader).load_state_dict(state)


_MOSAIC_CLASS: Any = None


def _mosaic_tokens(mds: Any) -> Any:
    """llm-foundry's StreamingTextDataset reduced to its pre-tokenized path (the ``tokens`` column)."""
    global _MOSAIC_CLASS
    if _MOSAIC_CLASS is None:
        import numpy as np
        import torch

        class MosaicTokens(mds.StreamingDataset):
            def __getitem__(self, idx: int) -> Any:
                sample = super().__getitem__(idx)
                return torch.from_numpy(np.frombuffer(sample["tokens"], dtype=np.int64)[:L + 1].copy())

        _MOSAIC_CLASS = MosaicTokens
    return _MOSAIC_CLASS


def batch_hash(batch: tuple[Any, Any]) -> str:
    h = hashlib.sha256()
    for t in batch:
        h.update(t.numpy().astype("int64").tobytes())
    return h.hexdigest()[:16]


def cell(args: dict) -> dict:
    """One fresh process's run: ``speed`` (first batch, steady, PSS), ``save`` or ``resume``."""
    loader = Loader(args["tool"], args["path"], args["workers"])
    if args["mode"] == "speed":
        next(loader)
        first = time.perf_counter() - _T0
        dt = steady_seconds(loader, args["warmup"], args["batches"])
        return {"first_batch_s": first, "tokens_per_s": args["batches"] * B * L / dt, "pss_mb": tree_pss_mb(),
                "through_s": time.perf_counter() - _T0}  # the process's start to its last timed batch
    if args["mode"] == "save":
        first = batch_hash(next(loader))
        for _ in range(RESUME_AT - 1):
            next(loader)
        Path(args["state"]).write_bytes(pickle.dumps(loader.state()))
        return {"hash": batch_hash(next(loader)), "first": first}
    loader.resume(pickle.loads(Path(args["state"]).read_bytes()))
    return {"hash": batch_hash(next(loader))}


# ---------------------------------------------------------------------------- the parent


def _child(argv: list[str], env: dict[str, str], what: str, timeout: float | None = None,
           script: str = __file__) -> dict:
    """Run ``script`` (this bench by default) with ``argv`` in a fresh process: its last line of JSON."""
    try:
        done = subprocess.run([sys.executable, str(Path(script).resolve()), *argv], capture_output=True,
                              text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what}: TimeoutError: no result within {timeout:.0f} s") from None
    if done.returncode != 0:
        raise RuntimeError(f"{what}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_cell(tool: str, path: Path, workers: int, env: dict[str, str], repeat: int, timeout: float | None = None,
             **kw: Any) -> dict:
    spec = {"tool": tool, "path": str(path), "workers": workers, **kw}
    runs = [_child(["--cell", json.dumps(spec)], env, f"{tool} w{workers}", timeout) for _ in range(repeat)]
    if kw.get("mode") != "speed":
        return runs[0]
    return {"first_batch_s": min(r["first_batch_s"] for r in runs),
            "tokens_per_s": max(r["tokens_per_s"] for r in runs), "pss_mb": min(r["pss_mb"] for r in runs)}


def resumes(tool: str, path: Path, workers: int, env: dict[str, str], work: Path) -> bool:
    state = work / f"state-{tool}-w{workers}.pkl"
    saved = run_cell(tool, path, workers, env, 1, mode="save", state=str(state))
    again = run_cell(tool, path, workers, env, 1, mode="resume", state=str(state))["hash"]
    return saved["hash"] == again != saved["first"]  # not a restart from the epoch's first batch


def ensure_peer(tool: str, store: Path, work: Path, env: dict[str, str]) -> tuple[Path, float]:
    """``tool``'s copy of the store's ids under ``work`` (converted once; its seconds kept beside it)."""
    out, facts = work / tool, work / f"{tool}.convert.json"
    if facts.is_file() and json.loads(facts.read_text()).get("store") == str(store):
        return out, json.loads(facts.read_text())["seconds"]
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    _child(["--convert", tool, str(store), str(out)], env, f"converting to {tool}")
    seconds = time.perf_counter() - t0
    facts.write_text(json.dumps({"store": str(store), "seconds": seconds}))
    return out, seconds


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


LABELS = {"memmap": "lmdata memmap", "parquet": "lmdata Parquet", "lance": "lmdata Lance",
          "litdata": "LitData 0.2.76", "mosaic": "Mosaic streaming 0.13.0"}


def _seconds(value: float | None) -> str:
    """A time for a table: "-" where none was measured (a --store given: its ingest was not timed here)."""
    return "-" if value is None or value != value else f"{value:.0f} s"


def table(rows: list[dict]) -> str:
    best = {w: max((r["tokens_per_s"] for r in rows if r["tool"] in PEERS and r["workers"] == w), default=None)
            for w in {r["workers"] for r in rows}}  # None: no peer in --tools
    lines = ["| loader | workers | steady M tok/s | vs best peer | first batch | PSS MB | bytes/token | "
             "conversion | exact resume |", "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {LABELS[r['tool']]} | {r['workers']} | {r['tokens_per_s'] / 1e6:.1f} | "
                     + (f"{r['tokens_per_s'] / best[r['workers']]:.2f}x" if best[r["workers"]] else "—")
                     + f" | {r['first_batch_s']:.2f} s | "
                     f"{r['pss_mb']:,.0f} | {r['bytes_per_token']:.2f} | {_seconds(r['conversion_s'])} | "
                     f"{'yes' if r['resume'] else 'no'} |")
    return "\n".join(lines)


def store_arguments(doc: str) -> argparse.ArgumentParser:
    """The options every local peers bench takes: the store (``--corpus`` tiled, or ``--store``), tools, workers."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--tokenizer", type=Path, default=CACHED_TOKENIZER)
    ap.add_argument("--work", type=Path, default=Path("/tmp/lmdata-peers"))
    ap.add_argument("--store", type=Path, help="an lmdata store to use instead of ingesting --corpus")
    ap.add_argument("--tools", type=lambda s: s.split(","), default=",".join(LMDATA + PEERS))
    ap.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default="0,2")
    return ap


def the_store(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Path, float, int | None]:
    """``--tools`` checked, ``--work`` made; the store, its ingest's seconds (nan for ``--store``) and
    how many times ``--corpus`` was tiled into it (None for ``--store``)."""
    unknown = set(args.tools) - set(LMDATA + PEERS)
    if unknown:
        ap.error(f"--tools: unknown {sorted(unknown)}; choose from {','.join(LMDATA + PEERS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    if args.store is not None:
        if not (args.store / "manifest.json").is_file():
            ap.error(f"--store {args.store}: no manifest.json there; give an lmdata store (or leave --store out)")
        return args.store, math.nan, None
    tiles = math.ceil(MIN_TOKENS / tokens_per_tile(args.corpus))
    store, facts = ensure_store(args.work, args.corpus, ensure_tokenizer(args.tokenizer), tiles, 1 << 20)
    return store, facts["seconds"], tiles


def heading(section: str, script: str, load: float, store: Path, corpus: Path | None, tiles: int | None,
            what: str) -> str:
    """A section's title and the line under it: the command as run, the machine and the store (``what``: more)."""
    return (f"## {section}\n\n`.venv-peers/bin/python bench/{script} {' '.join(sys.argv[1:])}` ({os.cpu_count()} "
            f"cores, load average {load:.1f} at start, {time.strftime('%Y-%m-%d')}; {n_tokens(store) / 1e6:.1f} M "
            f"tokens, {n_shards(store)} shards" + (f", {corpus.name} tiled x{tiles}" if corpus else "")
            + f"; shuffled B=32 x 1024{what}):")


def main() -> None:
    ap = store_arguments(__doc__)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=1, help="run each cell N times, keep its best (a shared box)")
    ap.add_argument("--readme", type=Path, help="rewrite this file's '## Peers (local)' section")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    compile_lmdata()  # the cells' first batches run from bytecode, as the peers' do
    load = os.getloadavg()[0]
    store, ingest_s, tiles = the_store(ap, args)
    env = cache_env(args.work)
    print(f"store {store}: {n_tokens(store) / 1e6:.1f} M tokens, {n_shards(store)} shards"
          + (f" ({args.corpus.name} tiled x{tiles})" if tiles else ""), flush=True)
    paths, conversion, size = {}, {}, {}
    for tool in args.tools:
        if tool in LMDATA:
            paths[tool], conversion[tool] = store, ingest_s
            size[tool] = disk_bytes(store / "train" / tool)
        else:
            paths[tool], conversion[tool] = ensure_peer(tool, store, args.work, env)
            size[tool] = disk_bytes(paths[tool])
        print(f"{tool}: {size[tool] / n_tokens(store):.2f} bytes/token, conversion {_seconds(conversion[tool])}", flush=True)
    decode_s = {tool: decode_copies(store, args.work, tool) for tool in args.tools if tool in LMDATA}
    rows = []
    for tool in args.tools:
        # a warm page cache (the setting): an ingest leaves its shards out of it, and this
        # box keeps ~2 GB, so what each tool's windows read is read once before its cells
        warm_page_cache(*(read_from(args.work, tool, store) if tool in LMDATA else [paths[tool]]))
        for workers in args.workers:
            r = run_cell(tool, paths[tool], workers, env, args.repeat, mode="speed", warmup=args.warmup,
                         batches=args.batches)
            rows.append({"tool": tool, "workers": workers, **r, "bytes_per_token": size[tool] / n_tokens(store),
                         "conversion_s": None if conversion[tool] != conversion[tool] else conversion[tool],
                         "resume": resumes(tool, paths[tool], workers, env, args.work)})
            print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers.json").write_text(json.dumps(rows, indent=1))
    body = (heading("Peers (local)", "peers.py", load, store, args.corpus if tiles else None, tiles, "")
            + "\n\n" + table(rows) + "\n\n" + notes(decode_s) + "\n")
    print(body)
    if args.readme:
        replace_section(args.readme, body, "Peers (local)")


def notes(decode_s: dict[str, float | None]) -> str:
    decoded = [f"{'Parquet' if fmt == 'parquet' else 'Lance'} {s:.1f} s" for fmt, s in decode_s.items() if s]
    decode = (f" The one-time decode into the machine's cache (every shard, a fresh process; not in the table): "
              f"{', '.join(decoded)}; what each tool's windows read (its files, or our decoded copies) is read once "
              "before its cells (a warm page cache).") if decoded else ""
    return (
        "How each ran (see bench/peers.py's docstring): lmdata `open_store(...).dataset('train', 1024, format)` + "
        "`make_loader(ds, 32, num_workers=w)`, default verification; \"conversion\" is the ingest of the text "
        "(tokenizing included) into all three formats at once." + decode + " LitData as litgpt's `TextFiles` / "
        f"`OpenWebText` prepare and read it: `optimize(chunk_bytes=\"{LIT_CHUNK}\", item_loader=TokensLoader())` of "
        "int32 ids, `StreamingDataset(item_loader=TokensLoader(block_size=1025), shuffle=True, drop_last=True)` + "
        "`StreamingDataLoader`. Mosaic as llm-foundry's `convert_dataset_hf.py --concat_tokens 1025` writes it "
        "(MDS, `tokens` column of int64 bytes, no compression) and `StreamingTextDataset` reads it "
        "(`StreamingDataset(shuffle=True, batch_size=32)`, defaults py1e / relaxed) + torch `DataLoader` "
        "(prefetch_factor 2, persistent workers). The peers' conversion reads the ids from the memmap store. "
        "Bytes per token: lmdata keeps uint16 ids (vocab 8,192; Lance rows written before this round held them "
        "twice, as a `tokens` list and `token_bytes`); LitData's are litgpt's int32, Mosaic's llm-foundry's int64. Conversion times are single runs "
        "(the load average at the start is in the line above the table). "
        "\"vs best peer\": tokens/s over the faster of LitData and Mosaic at the same worker count. First batch: "
        "from the process's start, imports included; PSS: the loader's processes (main + workers); exact resume: "
        f"a fresh process loads the state saved after {RESUME_AT} batches and hands out the same next batch."
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--cell"]:
        print(json.dumps(cell(json.loads(sys.argv[2]))))
    elif sys.argv[1:2] == ["--convert"]:
        convert(*sys.argv[2:5])
        print("{}")
    else:
        main()
