"""Byte-level BPE: ``train_bpe`` and ``Tokenizer`` (see DESIGN.md, "Tokenizer").

Attributes load on first use so that ``import lmdata.tokenizer`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmdata.tokenizer.encoder import Tokenizer
    from lmdata.tokenizer.train import train_bpe

__all__ = ["Tokenizer", "train_bpe"]


def __getattr__(name: str) -> Any:
    if name == "Tokenizer":
        from lmdata.tokenizer.encoder import Tokenizer

        return Tokenizer
    if name == "train_bpe":
        from lmdata.tokenizer.train import train_bpe

        return train_bpe
    raise AttributeError(f"module 'lmdata.tokenizer' has no attribute {name!r}")
