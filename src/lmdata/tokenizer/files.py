"""A ``Tokenizer`` from and to files: our saved directory, Hugging Face's ``tokenizer.json``, tiktoken's ranks.

A mixin of ``Tokenizer`` (``encoder.py``), which keeps encoding and decoding; here is what reads and
writes the files, and the content hash the files make.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from lmdata.errors import LmdataError
from lmdata.tokenizer import bytes_unicode, saved, tiktoken_ranks
from lmdata.tokenizer.patterns import Pattern


T = TypeVar("T", bound="TokenizerFiles")  # the Tokenizer a constructor makes


class TokenizerFiles:
    """The file constructors and writers of ``Tokenizer``."""

    @classmethod
    def from_files(
        cls: type[T], vocab_path: str | Path, merges_path: str | Path, special_tokens: list[str] | None = None
    ) -> T:
        """Load GPT-2 style ``vocab.json`` and ``merges.txt`` (e.g. GPT-2's own)."""
        vocab = bytes_unicode.read_vocab(Path(vocab_path))
        return cls(vocab, bytes_unicode.read_merges(Path(merges_path)), special_tokens)

    @classmethod
    def load(cls: type[T], path: str | Path) -> T:
        """Load a directory written by ``save``, checking its files against the recorded hash."""
        vocab_text, merges_text, specials, pattern, digest, bpe, flags, eot = saved.read_dir(Path(path))
        tok = cls(
            bytes_unicode.parse_vocab(vocab_text, str(Path(path) / "vocab.json")),
            bytes_unicode.parse_merges(merges_text, str(Path(path) / "merges.txt")),
            specials, pattern, bpe == "ranks", bpe == "words", flags, eot,
        )
        tok._hash = digest
        return tok

    @classmethod
    def from_hf(cls: type[T], path: str | Path, eot_token: str | None = None, eot_fallback: str | None = None) -> T:
        """Import a Hugging Face byte-level BPE ``tokenizer.json`` (its added tokens become special tokens);
        ``eot_token``: the one that ends documents in a store, if not ``<|endoftext|>``; ``eot_fallback``: the
        one to take when neither is among its special tokens (a folder's tokenizer_config.json eos_token)."""
        from lmdata._eot import EOT
        from lmdata.tokenizer import hf

        vocab, merges, specials, pattern, ignore_merges, flags = hf.read(path)
        if eot_token is None and EOT not in specials and eot_fallback in specials:
            eot_token = eot_fallback
        try:
            return cls(vocab, merges, specials, pattern, ignore_merges=ignore_merges, special_flags=flags,
                       eot_token=eot_token)
        except LmdataError as exc:  # (a merge of tokens the vocab lacks, a missing byte: name the file)
            raise LmdataError(f"{path}: {exc}") from None

    @classmethod
    def from_tiktoken(cls: type[T], path: str | Path, pattern: str | Pattern,
                      special_tokens: dict[str, int] | None = None, eot_token: str | None = None) -> T:
        """Import a tiktoken ranks file; ``pattern`` is its regex or name (e.g. "cl100k"),
        ``special_tokens`` maps each special token to its id (e.g. ``{"<|endoftext|>": 100257}``).
        A file with tokens that are not merges of two lower ranks (Llama 3's) encodes ``ranked``."""
        pattern = Pattern.get(pattern)  # (a bad --pattern is refused before the file is read)
        ranks = tiktoken_ranks.read(path)
        vocab = tiktoken_ranks.vocab_of(ranks, special_tokens or {}, path)
        merges, ranked = tiktoken_ranks.merges_of(ranks)
        try:
            return cls(vocab, merges, list(special_tokens or {}), pattern, ranked, eot_token=eot_token)
        except LmdataError as exc:  # (a byte missing from the ranks: name the file)
            raise LmdataError(f"{path}: {exc}") from None

    def save(self, path: str | Path) -> str:
        """Write the tokenizer directory atomically (``saved.FILES``, Hugging Face's included); returns the hash."""
        from lmdata.tokenizer import hf

        hf_json = hf.to_json_pieces(self.vocab, self.merges, self.special_ids, self._pattern, self.ignore_merges,
                                    self.special_flags)  # pieces, written as made: no file is held whole
        extra = {"tokenizer.json": hf_json, "tokenizer_config.json": hf.config_json(self.special_ids, self.eot_token)}
        return saved.write_dir(Path(path), bytes_unicode.vocab_pieces(self.vocab), bytes_unicode.merges_pieces(self.merges),
                               self.special_tokens, self.vocab_size, self.pattern, extra, self.bpe, self.special_flags,
                               self._eot_choice)

    def to_hf_json(self) -> str:
        """The text of a Hugging Face ``tokenizer.json`` that gives this tokenizer's ids."""
        from lmdata.tokenizer import hf

        return hf.to_json(self.vocab, self.merges, self.special_ids, self._pattern, self.ignore_merges, self.special_flags)

    def to_tiktoken(self) -> str:
        """The text of a tiktoken ranks file (special tokens and pattern are passed to tiktoken separately)."""
        return tiktoken_ranks.to_text(self.vocab, self.special_ids, self.special_flags)

    def _texts(self) -> tuple[str, str]:
        return bytes_unicode.vocab_json(self.vocab), bytes_unicode.merges_txt(self.merges)

    @property
    def hash(self) -> str:
        """Content hash, as recorded in ``lmdata_tokenizer.json`` (``"sha256:..."``)."""
        if self._hash is None:
            self._hash = saved.content_hash(*self._texts(), self.special_tokens, self.pattern, self.bpe,
                                            self.special_flags, self._eot_choice)[0]
        return self._hash
