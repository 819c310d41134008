"""bench/common.replace_section: a bench's --readme rewrites its tables and keeps what was written by hand."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "bench") not in sys.path:  # as when a bench runs: its folder is on sys.path
    sys.path.insert(0, str(ROOT / "bench"))

from common import HAND_WRITTEN, replace_section  # noqa: E402


def test_the_analysis_below_the_marker_outlives_a_rerun(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# Benchmarks\n\n## Peers\n\nold table\n\n{HAND_WRITTEN}\n\nWhat it says: **met**.\n\n"
                      "### A table by hand\n\n| a |\n\n## Next\n\nnext table\n")
    replace_section(readme, "## Peers\n\nnew table\n", "Peers")
    assert readme.read_text() == (f"# Benchmarks\n\n## Peers\n\nnew table\n\n{HAND_WRITTEN}\n\nWhat it says: **met**.\n\n"
                                  "### A table by hand\n\n| a |\n\n## Next\n\nnext table\n")


def test_without_the_marker_the_whole_section_is_replaced(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\n## Peers\n\nold table\n\nold words\n\n## Next\n\nnext table\n")
    replace_section(readme, "## Peers\n\nnew table\n", "Peers")
    assert readme.read_text() == "# Benchmarks\n\n## Peers\n\nnew table\n\n## Next\n\nnext table\n"
    replace_section(readme, "## Last\n\nlast table\n", "Last")  # a new section goes at the end
    assert readme.read_text().endswith("## Next\n\nnext table\n\n## Last\n\nlast table\n")
