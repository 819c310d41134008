"""Mappings without descriptors: the bytes of the file, read-only, unmapped with their last view."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import numpy as np
import pytest

from lmdata.io.mapped import map_file


def _maps_of(path) -> int:
    with open("/proc/self/maps") as fh:
        return sum(str(path) in line for line in fh)


def test_a_mapping_reads_the_file_holds_no_descriptor_and_unmaps(tmp_path):
    data = np.arange(10_000, dtype=np.uint16)
    path = tmp_path / "t.bin"
    data.tofile(path)
    before = len(os.listdir("/proc/self/fd"))
    view = map_file(path)
    assert len(os.listdir("/proc/self/fd")) == before  # no descriptor kept
    tokens = view.view(np.uint16)[100:200]
    del view
    gc.collect()
    assert np.array_equal(tokens, data[100:200]) and _maps_of(path) == 1  # the slice keeps it mapped
    with pytest.raises(ValueError):
        tokens[0] = 1  # read-only
    del tokens
    gc.collect()
    assert _maps_of(path) == 0


def test_an_empty_file_maps_to_an_empty_array(tmp_path):
    (tmp_path / "e.bin").write_bytes(b"")
    assert map_file(tmp_path / "e.bin").size == 0


def test_more_mappings_than_the_descriptor_limit(tmp_path):
    code = f"""
import resource, numpy as np
from lmdata.io.mapped import map_file
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
views = []
for i in range(300):
    p = {str(tmp_path)!r} + f"/f{{i}}.bin"
    np.full(8, i, np.uint32).tofile(p)
    views.append(map_file(p).view(np.uint32))
assert [int(v[3]) for v in views] == list(range(300))
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
