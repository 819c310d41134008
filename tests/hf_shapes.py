"""tokenizer.json files in the shapes models ship today, built with the `tokenizers` library itself.

Each is trained on the shipped sample by Hugging Face's own BPE trainer (so the file is
what `tokenizers` writes, not what we write), with the pre-tokenizer of a public model:

    llama3    Sequence[Split(Llama 3's regex), ByteLevel(use_regex=false)]
    deepseek  Sequence[Split(\\p{N}{1,3}), Split(CJK runs), Split(DeepSeek's regex), ByteLevel(use_regex=false)]
    noop      GPT-2's ByteLevel with an empty normalizer Sequence (a no-op some files carry)
"""

from __future__ import annotations

from pathlib import Path

SAMPLE = Path(__file__).parent.parent / "data" / "sample.txt"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_PATTERNS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|"
     r"\s*[\r\n]+|\s+(?!\S)|\s+"),
]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>"]
SHAPES = ("llama3", "deepseek", "noop")


def build(shape: str, out: Path, vocab_size: int = 600, specials: list[str] | None = None) -> Path:
    """Train a ``shape`` tokenizer.json on the sample with `tokenizers`; returns its path."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    split = [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False)
             for p in {"llama3": [LLAMA3_PATTERN], "deepseek": DEEPSEEK_PATTERNS}.get(shape, [])]
    tok = Tokenizer(models.BPE())
    if shape == "noop":
        tok.normalizer = normalizers.Sequence([])
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([*split, byte_level])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials or LLAMA3_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(SAMPLE)], trainer)
    path = Path(out) / f"{shape}-tokenizer.json"
    tok.save(str(path))
    return path
