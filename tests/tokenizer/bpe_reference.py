"""A small, obviously-correct BPE trainer and encoder: the fast ones must agree with it.

Written straight from DESIGN.md, for clarity over speed: recount every pair each merge,
apply merges by scanning lists of bytes.  Only for tiny inputs.
"""

from __future__ import annotations

from collections import Counter

import regex

PATTERN = regex.compile(r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def split_special(text: str, specials: list[str]) -> list[tuple[bool, str]]:
    """[(is_special, part)]: scan left to right; at each position the longest special wins."""
    parts, plain, i = [], "", 0
    while i < len(text):
        found = [s for s in specials if text.startswith(s, i)]
        if found:
            tok = max(found, key=len)
            parts += [(False, plain), (True, tok)]
            plain, i = "", i + len(tok)
        else:
            plain, i = plain + text[i], i + 1
    return parts + [(False, plain)]


def merge_word(word: list[bytes], pair: tuple[bytes, bytes]) -> list[bytes]:
    """Replace occurrences of ``pair`` left to right, without overlap."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def train(text: str, vocab_size: int, specials: list[str], pattern: str | None = None
          ) -> tuple[dict[int, bytes], list[tuple[bytes, bytes]]]:
    """Most frequent pair each step; ties: the greater (bytes, bytes) tuple."""
    regex_ = regex.compile(pattern) if pattern else PATTERN
    words: Counter = Counter()
    for is_special, part in split_special(text, specials):
        if not is_special:
            for pre in regex_.findall(part):
                words[tuple(bytes([b]) for b in pre.encode("utf-8"))] += 1
    vocab = {i: bytes([i]) for i in range(256)}
    merges = []
    while len(vocab) + len(specials) < vocab_size:
        pairs: Counter = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        vocab[len(vocab)] = best[0] + best[1]
        merged: Counter = Counter()
        for word, n in words.items():
            merged[tuple(merge_word(list(word), best))] += n
        words = merged
    for s in specials:
        vocab[len(vocab)] = s.encode("utf-8")
    return vocab, merges


def encode(text: str, vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]], specials: list[str],
           pattern: str | None = None) -> list[int]:
    """GPT-2's loop per pre-token: merge the lowest-ranked pair present until none is left."""
    regex_ = regex.compile(pattern) if pattern else PATTERN
    rank = {pair: r for r, pair in reversed(list(enumerate(merges)))}
    ids = {b: i for i, b in vocab.items()}
    out = []
    for is_special, part in split_special(text, specials):
        if is_special:
            out.append(ids[part.encode("utf-8")])
            continue
        for pre in regex_.findall(part):
            word = [bytes([b]) for b in pre.encode("utf-8")]
            while len(word) > 1:
                best = min(zip(word, word[1:]), key=lambda p: rank.get(p, len(merges)))
                if best not in rank:
                    break
                word = merge_word(word, best)
            out += [ids[w] for w in word]
    return out
