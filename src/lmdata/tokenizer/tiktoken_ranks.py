"""tiktoken's ranks file (``*.tiktoken``): one ``base64(token) rank`` line per token, ranks 0..n-1.

    IQ== 0          <- b"!"
    Ig== 1          <- b'"'
    ...
    IHRoZQ== 1820   <- b" the"

The file holds no merges, no pattern and no special tokens: the pattern is named on import,
special tokens are given with their ids.  A token's rank is its id.  Merges are recovered
the way tiktoken itself would build each token: BPE of its bytes using only lower ranks
ends in exactly two parts, the merge; a token for which it does not is an error.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from lmdata.errors import LmdataError


def to_text(vocab: dict[int, bytes], special_ids: dict[str, int]) -> str:
    """The ranks file of a vocab (special tokens left out: tiktoken takes them separately)."""
    specials = set(special_ids.values())
    ids = sorted(i for i in vocab if i not in specials)
    if ids != list(range(len(ids))):
        gap = next(i for n, i in enumerate(ids) if n != i)
        raise LmdataError(f"ids below {gap} are not all ordinary tokens; tiktoken ranks must be 0..n-1 without gaps")
    return "".join(f"{base64.b64encode(vocab[i]).decode('ascii')} {i}\n" for i in ids)


def read(path: str | Path) -> dict[bytes, int]:
    """token -> rank of a ranks file, checking ranks are 0..n-1 and tokens unique."""
    path = Path(path)
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        raise LmdataError(f"{path}: no such file") from None
    except OSError as exc:
        raise LmdataError(f"{path}: cannot read ({exc.strerror})") from None
    ranks: dict[bytes, int] = {}
    n = 0
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        n += 1
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            raise LmdataError(f"{path}:{lineno}: expected 'base64-token rank', got {line[:60]!r}") from None
        if len(ranks) != n:
            raise LmdataError(f"{path}:{lineno}: token {token.decode()!r} appears twice")
    if not ranks:
        raise LmdataError(f"{path}: holds no tokens; is it a tiktoken ranks file?")
    order = sorted(ranks.values())
    if order != list(range(len(order))):
        gap = next(n for n, r in enumerate(order) if n != r)
        raise LmdataError(f"{path}: rank {gap} is missing (ranks must be 0..{len(order) - 1} without gaps)")
    return ranks


def recover_merges(ranks: dict[bytes, int], where: str) -> list[tuple[bytes, bytes]]:
    """The merges, in rank order, that build every multi-byte token from lower-ranked ones."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = _bpe(token, ranks, rank)
        if len(parts) != 2:
            raise LmdataError(f"{where}: token {token!r} (rank {rank}) is not a merge of two lower-ranked "
                              "tokens; not a BPE ranks file")
        merges.append((parts[0], parts[1]))
    return merges


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
