"""Rewrite one bench's section of bench/README.md, leaving the other benches' sections alone."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, body: str, first: str, last: str | None = None) -> None:
    """Put ``body`` (which starts with ``## first``) in place of the ``## first`` .. ``## last``
    block of ``path`` (up to the next ``## `` heading after ``## last``), or append it."""
    path = Path(path)
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = "\n" + body.strip() + "\n"
    start = text.find(f"\n## {first}\n")
    if start < 0:
        text = text.rstrip("\n") + "\n" + block
    else:
        tail_from = text.find(f"\n## {last}\n", start) if last else -1
        end = text.find("\n## ", (tail_from if tail_from >= 0 else start) + 1)
        text = text[:start] + block + (text[end:] if end >= 0 else "")
    path.write_text(text)
