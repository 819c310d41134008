"""bench/stall.py rewrites only its own sections of the shared bench/README.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    if str(ROOT / "bench") not in sys.path:  # as when the script runs: its folder is on sys.path
        sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_stall_script", ROOT / "bench" / "stall.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_write_readme_replaces_method_and_stall_and_keeps_the_rest(tmp_path):
    script = load_script()
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\n## Ingest\n\ningest table\n\n## Method\n\nold\n\n## Stall\n\nold\n"
                      "### a table\n\n## Train\n\ntrain table\n")
    script.write_readme(readme, "## Method\n\nnew method\n\n## Stall\n\nnew stall\n")
    text = readme.read_text()
    assert "old" not in text and "new method" in text and "new stall" in text
    assert text.index("## Ingest") < text.index("## Method") < text.index("## Stall") < text.index("## Train")
    assert "ingest table" in text and "train table" in text
    fresh = tmp_path / "new.md"
    script.write_readme(fresh, "## Method\n\nm\n\n## Stall\n\ns\n")
    assert fresh.read_text().startswith("# Benchmarks\n") and "## Stall" in fresh.read_text()
