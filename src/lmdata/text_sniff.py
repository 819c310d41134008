"""Telling a binary file from text by its first bytes: the check ``ingest`` and ``tokenizer train`` share.

A file given as text that is an Arrow or Parquet file, holds NUL bytes, or is mostly invalid UTF-8
is refused in one line naming it, whatever ``--errors`` says: ``--errors replace`` is for text with
a few bad bytes, not for training on a PNG.
"""

from __future__ import annotations

from typing import Any

from lmdata.errors import LmdataError

SNIFF_BYTES = 1 << 16  # the start of a text source checked for binary data
MAX_INVALID = 0.25  # more invalid UTF-8 than this share of the sniffed bytes: binary, not text
STRIP_NUL = "if it is text with stray NUL bytes, remove them first: tr -d '\\000' < IN > OUT"


def check_text(path: Any, head: bytes, nul_is_binary: bool = True) -> None:
    """Refuse a binary file given as text (whatever ``errors`` says): an Arrow/Parquet file, NUL bytes
    (unless not ``nul_is_binary``: a tokenizer learns any byte), or mostly invalid UTF-8 in its first
    ``SNIFF_BYTES``."""
    what = None
    if head.startswith((b"ARROW1", b"\xff\xff\xff\xff")):
        what = "an Arrow IPC file; pass kind arrow (--kind arrow, or a .arrow name)"
    elif head.startswith(b"PAR1"):
        what = "a Parquet file; pass kind parquet (--kind parquet, or a .parquet name)"
    elif nul_is_binary and head.find(0) >= 0:
        what = f"binary data (a NUL byte at byte {head.find(0)}), not text; {STRIP_NUL}"
    else:
        cut = head[:-3] if len(head) == SNIFF_BYTES else head  # a character cut by the sniff is not invalid
        invalid = len(cut) - len(cut.decode("utf-8", "ignore").encode("utf-8"))
        if invalid > MAX_INVALID * len(cut):
            what = f"binary data ({invalid / len(cut):.0%} of its first {len(cut):,} bytes are invalid UTF-8), not text"
    if what:
        raise LmdataError(f"input {path}: {what}; --errors replace does not apply to binary files")
