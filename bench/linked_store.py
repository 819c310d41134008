"""A memmap store K times the size of another, its shards hard links to the other's files.

    linked_store(Path("/tmp/lmdata-scale/x175-s1048576"), 10)   # 10.3 B tokens in 9,920 shards

What a 10 B-token run's loader keeps per store (the shard count, the sampler's 10 M samples, a
mapping per shard and its page tables, the block marks) without 20 GB of text to tile and ingest
and 20 GB of page cache: the K copies of a shard are one file, so the data's footprint in memory
stays the source store's. It therefore measures how the loader's own costs grow with the store,
not DRAM against the CPU's caches (``scale.py`` does that up to 1 G tokens). Memmap only: the
other formats' decoded copies are keyed by their files' identity and would be made K times.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


def linked_store(source: Path, k: int) -> Path:
    """``<source>-linked-x<k>`` (made once; kept while its manifest names ``k`` times the source's shards)."""
    out = source.with_name(f"{source.name}-linked-x{k}")
    manifest = json.loads((source / "manifest.json").read_text())
    shards = manifest["splits"]["train"]["formats"]["memmap"]["shards"]
    if (out / "manifest.json").is_file():
        have = json.loads((out / "manifest.json").read_text())["splits"]["train"]["formats"]["memmap"]["shards"]
        if len(have) == k * len(shards):
            return out
    shutil.rmtree(out, ignore_errors=True)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "train" / "memmap").mkdir(parents=True)
    shutil.copytree(source / "tokenizer", tmp / "tokenizer")
    linked, first_doc, first_token = [], 0, 0
    for copy in range(k):
        for shard in shards:
            name = f"{len(linked):06d}"
            files = []
            for f in shard["files"]:
                path = f["path"].replace(shard["name"], name)
                os.link(source / "train" / "memmap" / f["path"], tmp / "train" / "memmap" / path)
                files.append({**f, "path": path})
            linked.append({**shard, "name": name, "first_doc": first_doc, "first_token": first_token, "files": files})
            first_doc, first_token = first_doc + shard["n_docs"], first_token + shard["n_tokens"]
    split = manifest["splits"]["train"]
    split.update(n_docs=first_doc, n_tokens=first_token, formats={"memmap": {"shards": linked}})
    split.pop("provenance", None)  # the way back to documents: not this store's (its documents repeat)
    manifest["splits"] = {"train": split}
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    tmp.rename(out)
    return out
