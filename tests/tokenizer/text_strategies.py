"""Hypothesis text made of the pieces that make BPE and the GPT-2 regex interesting."""

from hypothesis import strategies as st

PIECES = [
    " ", "  ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u2003", "\x1c", "\x0b",
    "a", "b", "ab", "the", "The", "Z", "é", "ß", "日本", "😀", "\u0301",
    "1", "23", "٣", ".", ",", "!", "?!", "-", "'", "'s", "'t", "'ll", "'re", "'ve", "'d", "'m", "\"",
    "<|endoftext|>", "<|end", "oftext|>", "<|", "|>", "<pad>",
]
SPECIALS = ["<|endoftext|>", "<pad>"]

texts = st.lists(st.sampled_from(PIECES), max_size=60).map("".join) | st.text(max_size=40)
