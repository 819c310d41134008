"""tiktoken's ranks file (``*.tiktoken``): one ``base64(token) rank`` line per token, ranks 0..n-1.

    IQ== 0          <- b"!"
    Ig== 1          <- b'"'
    ...
    IHRoZQ== 1820   <- b" the"

The file holds no merges, no pattern and no special tokens: the pattern is named on import,
special tokens are given with their ids.  A token's rank is its id.  Merges are recovered
the way tiktoken itself would build each token: BPE of its bytes using only lower ranks
ends in exactly two parts, the merge.

Real files also hold tokens that are not such a merge (Llama 3's ``b'.:.:'``, rank 100421).
tiktoken needs no merges: it looks a whole pre-token up first, then merges the adjacent
pair whose concatenation has the lowest rank.  Such a file imports ``ranked``: its merges
are every split of every token into two tokens (ordered as Hugging Face's converter orders
them), a merge's rank is the rank of the token it makes, and a token BPE cannot reach is
produced only as a whole pre-token (``unreachable``), so ids equal tiktoken's.  A file of
merges only keeps one merge per token (the encoder's faster table).

An empty token (Whisper's ``= 50256``: base64 of b"") keeps its rank reserved: encoding
never produces it, decoding gives b"".
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from lmdata.errors import LmdataError


def to_text(vocab: dict[int, bytes], special_ids: dict[str, int], flags: dict | None = None) -> str:
    """The ranks file of a vocab (special tokens left out: tiktoken takes them separately, without
    Hugging Face's added-token ``flags``, which are refused: its ids would differ)."""
    if flags:
        tok, names = next(iter(flags.items()))
        raise LmdataError(f"special token {tok!r} has Hugging Face's {'+'.join(names)}, which tiktoken cannot "
                          "represent; export --to hf instead")
    specials = set(special_ids.values())
    ids = sorted(i for i in vocab if i not in specials)
    hole = next((i for i in range(ids[-1] if ids else 0) if i not in vocab), None)  # (a special's id is no hole)
    if hole is not None:
        raise LmdataError(f"id {hole} is no token; tiktoken ranks must be 0..n-1 with a gap only at a special "
                          "token's id")
    return "".join(f"{base64.b64encode(vocab[i]).decode('ascii') or '='} {i}\n" for i in ids)


def read(path: str | Path) -> dict[bytes, int]:
    """token -> rank of a ranks file, checking ranks are 0..n-1 and tokens unique.

    Read a line at a time, so a broken first line is refused before the rest is read and memory
    is the ranks' own (a 10 M-line file read whole took 2.2 GB, 3x the file)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            ranks = _read_lines(f, path)
    except FileNotFoundError:
        raise LmdataError(f"{path}: no such file") from None
    except OSError as exc:
        raise LmdataError(f"{path}: cannot read ({exc.strerror})") from None
    if not ranks:
        raise LmdataError(f"{path}: holds no tokens; is it a tiktoken ranks file?")
    top = max(ranks.values())
    if top >= 2 * len(ranks) + 1024:  # (a gap is a special token's id: p50k_base's <|endoftext|> at 50256)
        raise LmdataError(f"{path}: rank {top} is far past its {len(ranks):,} tokens; is it a tiktoken ranks file?")
    return ranks


def missing_ranks(ranks: dict[bytes, int]) -> list[int]:
    """The ids below the top rank that no token has (tiktoken allows them: a special token sits there)."""
    seen = bytearray(max(ranks.values(), default=-1) + 1)  # one byte per rank, not a sorted list of ints
    for r in ranks.values():
        seen[r] = 1
    return [i for i, there in enumerate(seen) if not there]


def _read_lines(f, path: Path) -> dict[bytes, int]:
    """token -> rank of each ``base64 rank`` line of the open file ``f``, checked as read."""
    ranks: dict[bytes, int] = {}
    n = 0
    for lineno, line in enumerate(f, start=1):
        if not line.strip():
            continue
        n += 1
        try:
            token, rank = line.split()
            if not rank.isdigit():  # (bytes.isdigit: ASCII digits only; int() would take "-1", "1_0")
                raise ValueError(rank)
            raw = b"" if token.strip(b"=") == b"" else base64.b64decode(token, validate=True)  # "=": the empty token
            ranks[raw] = int(rank)
        except (ValueError, binascii.Error):
            if not line.isascii() or b"\0" in line:  # (a .gz had printed 60 bytes of gzip)
                raise LmdataError(f"{path}: binary, not a tiktoken ranks file (base64 and a rank a line); a "
                                  "compressed one must be decompressed first") from None
            shown = line.rstrip(b"\r\n")[:60]
            raise LmdataError(f"{path}:{lineno}: expected 'base64-token rank', got {shown!r}") from None
        if len(ranks) != n:
            raise LmdataError(f"{path}:{lineno}: token {token.decode()!r} appears twice")
    return ranks


def vocab_of(ranks: dict[bytes, int], special_tokens: dict[str, int], path: Path) -> dict[int, bytes]:
    """id -> token of the ranks, with each special token at its id (above the ranks)."""
    vocab = {i: tok for tok, i in ranks.items()}
    gaps = missing_ranks(ranks)
    for name, i in special_tokens.items():
        if i in vocab:
            free = f"{', '.join(map(str, gaps[:3]))} or " if gaps else ""
            raise LmdataError(f"--special-token {name}={i}: id {i} is the rank of {vocab[i]!r} in {path}; "
                              f"use an id of {free}{max(vocab) + 1} or more")
        vocab[i] = name.encode("utf-8")
    if unfilled := [i for i in gaps if i not in vocab]:
        raise LmdataError(f"{path}: rank {unfilled[0]} is missing (ranks must be 0..{max(ranks.values())} without "
                          "gaps, or a gap the id of a --special-token)")
    return vocab


def merges_of(ranks: dict[bytes, int]) -> tuple[list[tuple[bytes, bytes]], bool]:
    """(merges, ranked): the merge of each multi-byte token, in rank order, if every one is a merge
    of two lower-ranked tokens; else every split of every token, to be encoded ``ranked``."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = _bpe(token, ranks, rank)
        if len(parts) != 2:
            return all_splits(ranks), True
        merges.append((parts[0], parts[1]))
    return merges, False


def all_splits(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every (left, right) of two tokens that make a token, by the rank of the token they make, then of
    left and right (the order of Hugging Face's tiktoken converter)."""
    merges = []
    for token, _ in sorted(ranks.items(), key=lambda kv: kv[1]):
        local = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        merges += sorted(local, key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))
    return merges


def unreachable(vocab: dict[int, bytes], specials: set[int], id_chars, bpe, fast) -> dict[str, int]:
    """The tokens BPE by ranks does not make from their own bytes, as ``id_chars(token) -> id``:
    tiktoken gives them only to a pre-token that is the whole token.  ``bpe(id chars) -> ids`` is
    the Python BPE, ``fast`` the C encoder (or None), which is told them (``set_words``)."""
    found = {}
    for i, token in vocab.items():
        if len(token) < 2 or i in specials:
            continue
        got = fast.bpe(token) if fast is not None else bpe(id_chars(token))
        if len(got) != 1:
            found[token] = i
    if fast is not None:
        fast.set_words(list(found.items()))
    return {id_chars(token): i for token, i in found.items()}


def _bpe(token: bytes, ranks: dict[bytes, int], max_rank: int) -> list[bytes]:
    """tiktoken's merge loop on ``token`` with ranks below ``max_rank``: lowest-ranked pair first."""
    parts = [token[i : i + 1] for i in range(len(token))]
    get = ranks.get
    while len(parts) > 1:
        best, at = max_rank, -1
        for i in range(len(parts) - 1):
            r = get(parts[i] + parts[i + 1], max_rank)
            if r < best:
                best, at = r, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts
