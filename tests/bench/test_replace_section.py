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


def test_the_tokenizer_bench_keeps_the_other_scripts_subsection(tmp_path, monkeypatch):
    """bench/tokenizer.py --readme kept only its own "(N MB)" blocks: tokenizer_custom.py's subsection went."""
    from types import SimpleNamespace

    import tokenizer as bench_tokenizer

    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\n## Tokenizer\n\nintro\n\n### a.txt (1 MB)\n\nold a\n\n"
                      "### Custom pre-tokenizer patterns (130,072 ranks)\n\ncustom table\n\n## Next\n\nnext\n")
    args = SimpleNamespace(input="b.txt", orig_input="b.txt", input_mb=2.0, vocab_size=300, threads=2, repeat=1,
                           tile_mb=0, skip="")
    monkeypatch.setattr(bench_tokenizer, "block", lambda args, results, header, cmd: "### b.txt (2 MB)\n\nnew b")
    bench_tokenizer.readme_section(readme, args, {}, "header")
    text = readme.read_text()
    assert "### a.txt (1 MB)" in text and "### b.txt (2 MB)\n\nnew b" in text
    assert "### Custom pre-tokenizer patterns (130,072 ranks)\n\ncustom table" in text
    assert text.index("### b.txt") < text.index("### Custom") < text.index("## Next")


def test_the_recorded_sections_a_rerun_would_replace_keep_their_analysis():
    """peers_remote.py and ray_driver.py rewrite sections whose recorded runs and analysis had no marker (a rerun
    with --readme had deleted the 188 M-token tables); ray_driver.py's section name had not matched its heading."""
    import ray_driver

    text = (ROOT / "bench" / "README.md").read_text()
    for heading in ("## Peers (remote)\n", f"## {ray_driver.SECTION}\n"):
        start = text.index(heading)
        assert HAND_WRITTEN in text[start:text.index("\n## ", start + 1)], heading
