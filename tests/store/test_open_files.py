"""Many more shards than open files allowed: readers hold no descriptor per shard.

A store of 1,000+ tiny shards per format is read under a limit of 100 open files, in a
subprocess (``resource.setrlimit``): the loader over a whole epoch (random access to every
shard) with 0 and 2 workers, ``verify``, ``inspect`` and ``sql`` all finish, and nothing is
printed at interpreter exit (no "Exception ignored in ..." from a finalizer).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from lmdata.store.manifest import Manifest, SplitInfo, write_manifest

FORMATS = ["memmap", "parquet", "lance"]
LIMIT = 100


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory, store_builder):
    from lmdata.store.formats import lance_fragments

    helpers = store_builder.__globals__  # tests/store/conftest.py (not importable by name beside other conftests)
    random_docs, write_split = helpers["random_docs"], helpers["write_split"]

    path = tmp_path_factory.mktemp("fds") / "store"
    eot = 50256
    docs = random_docs(np.random.default_rng(0), 82_000, eot, max_len=60)
    info = SplitInfo(n_docs=len(docs), n_tokens=int(sum(len(d) for d in docs)))
    old, lance_fragments.FRAGMENT_TOKENS = lance_fragments.FRAGMENT_TOKENS, 60  # a fragment per shard or two
    try:
        for fmt in FORMATS:
            info.formats[fmt] = write_split(path, "train", fmt, docs, np.dtype(np.uint16), 60)
    finally:
        lance_fragments.FRAGMENT_TOKENS = old
    write_manifest(path, Manifest(tokenizer_hash="0" * 64, vocab_size=eot + 1, dtype="uint16", eot_id=eot,
                                  shard_tokens=60, splits={"train": info}))
    assert all(len(s) >= 1000 for s in info.formats.values()), {f: len(s) for f, s in info.formats.items()}
    return path


SCRIPT = textwrap.dedent("""
    import itertools, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))
    from lmdata.data import make_loader
    from lmdata.inspect import inspect, sql
    from lmdata.store import open_store
    from lmdata.store.verify import verify_store
    store = sys.argv[1]
    for fmt in {formats!r}:
        for workers, batches in ((0, None), (2, 12)):  # the whole epoch in-process; 12 x 96 windows in workers
            ds = open_store(store).dataset("train", 32, format=fmt)
            n = sum(1 for _ in itertools.islice(make_loader(ds, 96, num_workers=workers, seed=3), batches))
            print(fmt, workers, "batches", n)
    verify_store(store).raise_if_bad()
    inspect(store)
    print(sql(store, "SELECT count(*) FROM docs")[1], sql(store, "SELECT sum(len(tokens)) FROM tokens_lance")[1],
          sql(store, "SELECT sum(len(tokens)) FROM tokens_parquet")[1])
    print("ok")
""")


def test_readers_stay_under_a_low_open_file_limit(many_shards):
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(limit=LIMIT, formats=FORMATS), str(many_shards)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    assert done.stderr == "", done.stderr[-3000:]  # nothing printed, at exit or before


PREAD = {**os.environ, "LMDATA_MAP_SHARDS": "0"}  # the descriptor pool's tests: every window a pread

MAPPED = textwrap.dedent("""
    import resource, sys
    import numpy as np
    resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))
    from lmdata.io.descriptors import descriptors
    from lmdata.store import open_store

    def table():
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("FDSize:"))

    before = table()
    reader = open_store(sys.argv[1]).reader("train", sys.argv[2])
    n = (reader.n_tokens - 1) // 32
    for k in range(0, n, 4096):  # every window: every shard
        reader.windows(np.arange(k, min(n, k + 4096)) * 32, 33)
    print(len(reader.shards), int((reader._mappings.bases != 0).sum()), len(descriptors().fds), table() - before)
""")
MAPPED_LIMIT = 4096  # the pool moves descriptors above 1,024 at this limit: the table had grown past 2,048


@pytest.mark.parametrize("fmt", ["memmap", "parquet"])
def test_mapped_shards_hold_no_descriptor_and_the_descriptor_table_never_grows(many_shards, fmt):
    """Mapped (the default), a memmap shard's first touch maps it and closes its descriptor, a few dozen
    at a time: every window of 1,000+ shards is read, none is held, and the process's descriptor table
    does not grow (each growth in a process with threads waits for an RCU grace period: 7-15 ms here).
    Parquet's decoded copies (made by a process before) keep their descriptors in the pool: another
    process may evict or remake a copy, and a pread must read the file a mapping was made through."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < MAPPED_LIMIT:
        pytest.skip(f"hard open-file limit {hard} < {MAPPED_LIMIT}")
    run = [sys.executable, "-c", MAPPED.format(limit=MAPPED_LIMIT), str(many_shards), fmt]
    env = {**os.environ, "LMDATA_MAP_SHARDS": "1"}
    for attempt in range(2 if fmt == "parquet" else 1):  # Parquet: the first run makes the copies
        done = subprocess.run(run, capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    shards, mapped, held, grown = map(int, done.stdout.split())
    assert shards >= 1000
    assert (mapped, held, grown) == (shards, 0, 0) if fmt == "memmap" else held == shards


HELD = textwrap.dedent("""
    import resource, sys
    import numpy as np
    resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit}))
    from lmdata.io.descriptors import descriptors
    from lmdata.store import open_store
    reader = open_store(sys.argv[1]).reader("train", "memmap")
    n = (reader.n_tokens - 1) // 32
    for k in range(0, n, 4096):  # every window: every shard
        reader.windows(np.arange(k, min(n, k + 4096)) * 32, 33)
    pool = descriptors()
    print(len(reader.shards), len(pool.fds), pool.epoch)
""")


def test_a_store_of_more_shards_than_a_quarter_of_the_limit_keeps_every_shard_open(many_shards):
    """The pool is the limit less a reserve (``main_pool_size``), not a quarter of it: a 10 B-token store
    (11,761 shards under a limit of 20,000) had thrashed a pool of 5,000 at a quarter of its rate."""
    import resource

    from lmdata.io.descriptors import main_pool_size
    from lmdata.store import open_store

    n = len(open_store(many_shards).manifest.splits["train"].formats["memmap"])
    limit = next(lim for lim in range(n, 8 * n) if main_pool_size(lim) >= n)  # the lowest that holds n
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < limit:
        pytest.skip(f"hard open-file limit {hard} < {limit}")
    assert limit // 4 < n <= main_pool_size(limit)
    done = subprocess.run([sys.executable, "-c", HELD.format(limit=limit), str(many_shards)],
                          capture_output=True, text=True, timeout=300, env=PREAD)
    assert done.returncode == 0, done.stderr[-3000:]
    shards, held, closed = map(int, done.stdout.split())
    assert (shards, held, closed) == (n, n, 0)


PAST = textwrap.dedent("""
    import glob, os, resource, sys
    import numpy as np
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))  # a pool of 64; a batch opens up to 32 besides
    from lmdata.io.descriptors import descriptors
    from lmdata.store import open_store
    store = sys.argv[1]
    reader = open_store(store).reader("train", "memmap")
    files = sorted(glob.glob(os.path.join(store, "train", "memmap", "tokens-*.bin")))
    tokens = np.concatenate([np.fromfile(f, dtype=np.uint16) for f in files])
    starts = np.random.default_rng(0).permutation(len(tokens) - 40)[:3000]
    for k in range(0, len(starts), 16):  # a first pass: every shard met, the pool full early
        reader.windows(np.sort(starts[k:k + 16]), 40)
    pool = descriptors()
    epoch, same = pool.epoch, True
    for k in range(0, len(starts), 16):  # a second: the shards past the pool opened per batch, closed after
        got = reader.windows(np.sort(starts[k:k + 16]), 40)
        same &= bool((got == tokens[np.sort(starts[k:k + 16])[:, None] + np.arange(40)]).all())
    print(len(reader.shards), pool.size, len(pool.fds), pool.epoch - epoch, same, len(os.listdir("/proc/self/fd")))
""")


def test_past_the_pool_a_batch_opens_what_it_misses_and_the_pool_keeps_what_it_holds(many_shards):
    """Under a limit far below the shard count (128 descriptors, 1,000+ shards), once every shard has been
    met the pool closes nothing (its epoch stands), every window is the shard files' bytes, and the
    descriptors a batch opened are closed after it."""
    done = subprocess.run([sys.executable, "-c", PAST, str(many_shards)], capture_output=True, text=True, timeout=300,
                          env=PREAD)
    assert done.returncode == 0, done.stderr[-3000:]
    shards, size, held, closed, same, open_now = done.stdout.split()
    assert int(shards) > 10 * int(size) and int(held) == int(size)
    assert (closed, same) == ("0", "True")
    assert int(open_now) <= int(size) + 16  # the pool's own, the interpreter's few: none left from a batch
