"""``Tokenizer``: encode text to ids and back with a trained (or GPT-2) vocab and merges.

Speed comes from caching: text is cut into chunks (see ``pretokenize``), and a
chunk seen before costs one dict lookup, so the regex and BPE run only on new chunks.
Inside the token loop a token id is a character, ``chr(id)``: a merge is a C-speed
``str.replace`` of a two-character pair.  Pre-tokens longer than ``_LONG`` use a heap
over a linked list instead, so a 1 MB run of one letter encodes in O(n log n).

Where the C accelerator ``lmdata.tokenizer._fastbpe`` was built (``pip install -e .`` builds it when a C
compiler is present) the whole loop -- chunk cutting, the chunk cache, pre-tokenization (gpt2, cl100k, o200k,
a custom regex compiled by ``regex_program``; the ``regex`` module's classes), special tokens and BPE -- runs
in C with the GIL released (``encode_batch``: threads sharing one chunk cache; a regex outside the C matcher's
subset is called from C, GIL held), giving the ids of the pure-Python path, the fallback.
``LMDATA_PURE_PYTHON=1`` forces pure Python (``Tokenizer.accelerated``; ``accelerator``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from itertools import chain, islice, repeat
from operator import add

from lmdata._eot import EOT
from lmdata.errors import LmdataError
from lmdata.tokenizer import added_tokens, batch, tiktoken_ranks
from lmdata.tokenizer.files import TokenizerFiles
from lmdata.tokenizer.accelerator import pure_python_forced, warn_not_built
from lmdata.tokenizer.ids import id_bytes
from lmdata.tokenizer.patterns import Pattern
from lmdata.tokenizer.pretokenize import safe_cut, special_splitter
from lmdata.tokenizer.train import check_special_tokens

try:
    from lmdata.tokenizer import _fastbpe
except ImportError:  # no C compiler at install time: the pure-Python path
    _fastbpe = None

_LONG = 64  # pre-tokens longer than this use the heap BPE
_MAX_CACHED_CHUNK = 128  # longer chunks are encoded every time, never cached
_CACHE_ENTRIES = 1 << 18  # a C cache this full is cleared (its table: 2x as many 64-byte slots, 32 MB)


class Tokenizer(TokenizerFiles):
    """Byte-level BPE; special tokens are never merged.

    ``pattern`` is the pre-tokenizer: "gpt2" (default), "cl100k", "o200k" or any regex
    (the ``regex`` module's syntax).  ``ranked=True`` is tiktoken's BPE over ranks (a rank file
    whose tokens are not all merges): a merge's rank is the id of the token it makes, and a
    pre-token that is a token no merge reaches is that token (``tiktoken_ranks``).
    ``ignore_merges=True`` is Hugging Face's flag of that name (Llama 3's file): merges rank by
    their order, a pre-token that is a token is that token, one pair merged at a time.
    ``special_flags``: ``{token: ["lstrip", "rstrip", "single_word", "nonspecial"]}``, Hugging Face's added-token
    flags (RoBERTa's ``<mask>`` takes the spaces before it; ``added_tokens``).  ``eot_token``: the special token
    that ends each document in a store (``eot_id``), if not ``<|endoftext|>`` (an imported Llama 3's).
    """

    _slice_chars = 1 << 20  # long texts are encoded a slice of about this many characters at a time

    def __init__(
        self, vocab: dict[int, bytes], merges: list[tuple[bytes, bytes]], special_tokens: list[str] | None = None,
        pattern: str | Pattern | None = None, ranked: bool = False, ignore_merges: bool = False,
        special_flags: dict[str, list[str]] | None = None, eot_token: str | None = None,
    ) -> None:
        self._pattern = Pattern.get(pattern)
        self.ranked = bool(ranked)
        self.ignore_merges = self.ranked or bool(ignore_merges)  # whole words first, one merge at a time
        self.vocab = dict(vocab)
        self.merges = list(merges)
        self.special_tokens = check_special_tokens(special_tokens)
        ids = {tok: i for i, tok in self.vocab.items()}
        for tok in self.special_tokens:  # a special token missing from the vocab is appended
            raw = tok.encode("utf-8")
            if raw not in ids:
                ids[raw] = max(self.vocab, default=-1) + 1
                self.vocab[ids[raw]] = raw
        self.special_ids = {tok: ids[tok.encode("utf-8")] for tok in self.special_tokens}
        self.special_flags = added_tokens.check_flags(special_flags, self.special_tokens)
        strips = any(set(f) - {"nonspecial"} for f in self.special_flags.values())  # (only those need Python)
        self._added = added_tokens.AddedSplitter(self.special_ids, self.special_flags) if strips else None
        plain = {t: i for t, i in self.special_ids.items() if "nonspecial" in self.special_flags.get(t, ())}
        self._added_plain = added_tokens.AddedSplitter(plain, self.special_flags) if plain else None
        special = [t for t in self.special_tokens if "nonspecial" not in self.special_flags.get(t, ())]
        if eot_token is not None and eot_token not in special:  # (a non-special one is matched inside documents)
            raise LmdataError(f"eot token {eot_token!r} is not a special token of this tokenizer "
                              f"({', '.join(special) or 'it has none'})")
        self._eot_choice = None if eot_token == EOT else eot_token  # (None: the default, outside the hash)
        self._vocab_size = max(self.vocab, default=-1) + 1
        if self._vocab_size > 0x110000 or min(self.vocab, default=0) < 0:
            raise LmdataError("vocab ids must lie in 0..1114111")
        missing = [b for b in range(256) if bytes([b]) not in ids]
        if missing:
            raise LmdataError(f"vocab lacks the single byte {bytes([missing[0]])!r}; a byte-level vocab needs all 256")
        # bytes -> id chars: identity for our own vocabs, a permutation for GPT-2's
        table = {b: ids[bytes([b])] for b in range(256)}
        self._byte_table = None if all(b == i for b, i in table.items()) else str.maketrans(table)
        self._ranks, self._merged, self._by_rank = _merge_tables(self.merges, ids, self.ranked)
        self._splitter = special_splitter(self.special_tokens)
        self._hash: str | None = None
        self._byte_ids = [table[b] for b in range(256)]
        self._whole: dict[str, int] = {}  # ranked: id-char form of a token no merge reaches -> its id
        self._fast = self._make_fast()
        if self.ignore_merges:
            self._whole = tiktoken_ranks.unreachable(self.vocab, set(self.special_ids.values()), self._id_chars,
                                                     lambda s: _bpe_heap(s, self._ranks, self._merged, True),
                                                     self._fast)
        self._fast_plain = self._make_fast_plain()
        self._clear_caches()

    def _id_chars(self, token: bytes) -> str:
        """A token's bytes as id chars, the form BPE works on."""
        s = token.decode("latin-1")
        return s if self._byte_table is None else s.translate(self._byte_table)

    def _make_fast(self, specials: list[tuple[str, int]] | None = None):
        """The C encoder, or None when it is not built or LMDATA_PURE_PYTHON=1; it splits off ``specials``
        (default: every special token)."""
        if _fastbpe is None or pure_python_forced():
            return warn_not_built(_fastbpe is not None)  # None; warns once per process unless LMDATA_PURE_PYTHON=1
        from lmdata.tokenizer import unicode_classes

        if self.ignore_merges:  # (left, right, merged, rank): one merge at a time (ranked: splits share a rank)
            triples = [(ord(p[0]), ord(p[1]), ord(self._merged[p]), r) for p, r in self._ranks.items()]
        else:
            triples = [(ord(pair[0]), ord(pair[1]), ord(merged)) for pair, merged in self._by_rank]
        mode = self._pattern.c_mode
        if mode is not None:
            unicode_classes.install(_fastbpe)
        fast = _fastbpe.Encoder(triples, self._byte_ids, self._pattern.findall, _CACHE_ENTRIES,
                                _MAX_CACHED_CHUNK - 1, -1 if mode is None else mode, self._vocab_size,
                                self._pattern.c_program if mode == 3 else None)
        if mode is not None:
            fast.set_specials(list(self.special_ids.items()) if specials is None else specials)  # in C as well
        if self._whole:  # (a ranked tokenizer arriving in a worker)
            fast.set_words([(self.vocab[i], i) for i in self._whole.values()])
        return fast

    def _make_fast_plain(self):
        """A second C encoder splitting off only the non-special added tokens: plain-text encoding (ingest's)
        matches them as Hugging Face does and stays on the C threads; None where there are none."""
        if self._added_plain is None or self._fast is None or self._pattern.c_mode is None or self._added is not None:
            return None  # (lstrip and the like, two passes: the Python splitter, ``_added_plain``)
        return self._make_fast(list(self._added_plain.ids.items()))

    @property
    def bpe(self) -> str:
        """How merges apply: "merges" (by their order), "ranks" (tiktoken's), "words" (HF's ignore_merges)."""
        return "ranks" if self.ranked else "words" if self.ignore_merges else "merges"

    @property
    def pattern(self) -> str:
        """The pre-tokenizer regex (GPT-2's unless another was given)."""
        return self._pattern.text

    @property
    def pattern_name(self) -> str | None:
        """"gpt2", "cl100k" or "o200k" for a named pattern, None for a custom regex."""
        return self._pattern.name

    @property
    def accelerated(self) -> bool:
        """Whether encoding runs in the C accelerator (else the pure-Python path)."""
        return self._fast is not None

    @property
    def gil_free(self) -> bool:
        """Whether encoding runs in C with the GIL released (so threads scale): the C
        accelerator and a named pattern or a custom regex its matcher takes (``regex_program``);
        any other regex, or added tokens with Hugging Face's lstrip, rstrip or single_word, run in Python."""
        return self._fast is not None and self._pattern.c_mode is not None and self._added is None

    @property
    def vocab_size(self) -> int:
        """One more than the largest id (special tokens included): every id is below it."""
        return self._vocab_size

    @property
    def eot_token(self) -> str:
        """The special token that ends each document in a store: ``<|endoftext|>`` unless chosen."""
        return self._eot_choice or EOT

    @property
    def eot_id(self) -> int | None:
        """Id of ``eot_token`` if it is one of the special tokens (not a ``nonspecial`` one), else None."""
        return None if "nonspecial" in self.special_flags.get(self.eot_token, ()) else self.special_ids.get(self.eot_token)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()  # ship to worker processes without the caches
        state["_chunk_cache"], state["_head_cache"], state["_word_cache"] = {}, {}, {}
        state["_fast"] = state["_fast_plain"] = None  # C objects: rebuilt on arrival
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._fast = self._make_fast()
        self._fast_plain = self._make_fast_plain()

    def _clear_caches(self) -> None:
        self._chunk_cache: dict[str, tuple[int, ...]] = {}  # piece p -> ids of " " + p
        self._head_cache: dict[str, tuple[int, ...]] = {}  # first chunk of a text -> ids
        self._word_cache: dict[str, tuple[int, ...]] = {}  # pre-token -> ids
        if self._fast is not None:
            self._fast.clear()

    # -- encoding --------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; occurrences of the special tokens become their ids."""
        if self._added is not None:  # special tokens with Hugging Face's flags: split off in Python
            return self._added.encode(text, self._encode_into)
        if self._fast is not None and self._pattern.c_mode is not None:
            return self._fast.encode(text)  # special tokens split in C
        ids: list[int] = []
        if self._splitter is None or not any(tok in text for tok in self.special_tokens):
            self._encode_into(text, ids)
            return ids
        for i, part in enumerate(self._splitter.split(text)):
            if i % 2:
                ids.append(self.special_ids[part])
            elif part:
                self._encode_into(part, ids)
        return ids

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of ``text`` with special-token strings treated as plain text."""
        if self._fast_plain is not None:  # Hugging Face's non-special added tokens are matched in any text
            return self._fast_plain.encode(text)
        if self._added_plain is not None:
            return self._added_plain.encode(text, self._encode_into)
        if self._fast is not None:
            return self._fast.encode_plain(text)
        ids: list[int] = []
        self._encode_into(text, ids)
        return ids

    def _encode_into(self, text: str, ids: list[int]) -> None:
        """Append the ids of ``text`` (no special tokens) to ``ids``, a ~1 MB slice (ending at a chunk
        boundary) at a time: a 23 MB text split at once would hold ~4M piece strings, ~250 MB."""
        if self._fast is not None:
            ids.extend(self._fast.encode_plain(text))
            return
        start = 0
        while len(text) - start > self._slice_chars:
            boundary = self._pattern.find_chunk_boundary(text, start + self._slice_chars)
            if boundary is None:
                break
            self._encode_slice(text[start:boundary], ids)
            start = boundary
        self._encode_slice(text[start:] if start else text, ids)

    def _encode_slice(self, text: str, ids: list[int]) -> None:
        """Append the ids of ``text`` to ``ids``: one dict lookup per chunk seen before."""
        pieces = self._pattern.split_pieces(text)
        ids.extend(self._encode_head(pieces[0]))
        if len(pieces) == 1:
            return
        cache = self._chunk_cache
        found = list(map(cache.get, islice(pieces, 1, None)))
        try:
            i = found.index(None)  # misses are found at C speed, then filled one by one
        except ValueError:
            i = -1
        while i >= 0:
            piece = pieces[i + 1]
            got = cache.get(piece)
            if got is None:
                got = self._encode_chunk(" " + piece)
                if len(piece) < _MAX_CACHED_CHUNK:
                    if len(cache) >= _CACHE_ENTRIES:
                        cache.clear()
                    cache[piece] = got
            found[i] = got
            try:
                i = found.index(None, i + 1)
            except ValueError:
                i = -1
        ids.extend(chain.from_iterable(found))

    def _encode_head(self, head: str) -> tuple[int, ...]:
        got = self._head_cache.get(head)
        if got is None:
            got = self._encode_chunk(head)
            if len(head) < _MAX_CACHED_CHUNK:
                if len(self._head_cache) >= _CACHE_ENTRIES:
                    self._head_cache.clear()
                self._head_cache[head] = got
        return got

    def _encode_chunk(self, chunk: str) -> tuple[int, ...]:
        """Run the regex and BPE over one chunk (a cache miss)."""
        cache = self._word_cache
        words = self._pattern.findall(chunk)
        out: tuple[int, ...] = ()
        for word in words:
            got = cache.get(word)
            if got is None:
                got = self._bpe(word)
                if len(word) < _MAX_CACHED_CHUNK:
                    if len(cache) >= _CACHE_ENTRIES:
                        cache.clear()
                    cache[word] = got
            out = got if len(words) == 1 else out + got
        return out

    def _bpe(self, word: str) -> tuple[int, ...]:
        """BPE of one pre-token: repeatedly merge the lowest-ranked adjacent pair."""
        s = word.encode("utf-8").decode("latin-1")
        if self._byte_table is not None:
            s = s.translate(self._byte_table)
        if self.ignore_merges:  # tiktoken: a whole piece that is a token first, then BPE by ranks (ties by position)
            whole = self._whole.get(s)
            return (whole,) if whole is not None else _bpe_heap(s, self._ranks, self._merged, True)
        if len(s) > _LONG:
            return _bpe_heap(s, self._ranks, self._merged)
        rank_of, by_rank, unknown = self._ranks.get, self._by_rank, len(self._by_rank)
        none = repeat(unknown)
        while len(s) > 1:  # all C-level loops: pairs are s[i] + s[i+1], unknown ones rank last
            best = min(map(rank_of, map(add, s, s[1:]), none))
            if best == unknown:
                break
            pair, merged = by_rank[best]
            s = s.replace(pair, merged)
        return tuple(map(ord, s))

    def encode_iterable(self, texts: Iterable[str], *, min_buffer: int = 1 << 16) -> Iterator[int]:
        """Lazily encode a stream of strings (e.g. a file's lines) as one text, in bounded memory.

        Pieces are gathered to ``min_buffer`` characters, then encoded up to a safe cut
        (never inside a pre-token or a possible special token), so the ids equal
        ``encode("".join(texts))``.
        """
        buffer, next_try = "", min_buffer
        for text in texts:
            buffer += text
            if len(buffer) < next_try:
                continue
            cut = safe_cut(buffer, self.special_tokens, self._pattern)
            if self._added is not None:  # (no flagged token may take the whitespace at the cut)
                cut = self._added.safe_cut(buffer, cut, lambda t: safe_cut(t, self.special_tokens, self._pattern))
            if cut:
                yield from self.encode(buffer[:cut])
                buffer = buffer[cut:]
            next_try = max(min_buffer, 2 * len(buffer))  # no cut found: wait for twice as much
        if buffer:
            yield from self.encode(buffer)

    def encode_batch(
        self, texts: list[str], num_workers: int | None = None, *, pool_min_chars: int = 1 << 16
    ) -> list[list[int]]:
        """``[encode(t) for t in texts]``, spread over ``num_workers`` threads (default: all cores).

        The C encoder releases the GIL, so threads scale (its lists of ints are left out of
        the cyclic garbage collector, which would walk every id); batches under
        ``pool_min_chars`` characters stay on the calling thread.  Without the C encoder, big
        batches (8 M characters or more) go to a process pool instead.
        """
        return batch.encode_batch(self, texts, num_workers, pool_min_chars)

    def encode_arrays(
        self, texts: list[str], *, eot: int | None = None, dtype: str = "uint32", ordinary: bool = False,
        num_workers: int | None = 1, pool_min_chars: int = 1 << 16,
    ) -> batch.EncodedBatch:
        """Every text's ids in one NumPy array, each text followed by ``eot`` (an id) if given.

        Returns ``EncodedBatch(tokens, lengths, text_bytes)``.  No Python int is made per id,
        so on the C path threads (``num_workers``; None = all cores) spend all of it without
        the GIL.  ``ordinary=True`` treats special-token strings as text (``encode_ordinary``).
        """
        return batch.encode_arrays(self, texts, eot, dtype, ordinary, num_workers, pool_min_chars)

    def _encode_list(self, texts: list[str]) -> list[list[int]]:
        if self._fast is not None and self._added is None and (self._pattern.c_mode is not None or self._splitter is None
                                       or not any(map(self._splitter.search, texts))):
            return self._fast.encode_many(texts)  # one GIL release for the lot, specials split in C
        return [self.encode(t) for t in texts]

    # -- decoding --------------------------------------------------------------------

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; byte sequences that are not valid UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The raw bytes of ``ids``: ints, or a 1-D NumPy array or torch tensor."""
        return id_bytes(self.vocab, ids)


def _merge_tables(
    merges: list[tuple[bytes, bytes]], ids: dict[bytes, int], ranked: bool = False
) -> tuple[dict[str, int], dict[str, str], list[tuple[str, str]]]:
    """Merges as id-char pairs: pair -> rank, pair -> merged id char, rank -> (pair, merged).
    ``ranked``: a merge's rank is the id of the token it makes (rank -> pair is then unused)."""
    ranks: dict[str, int] = {}
    merged: dict[str, str] = {}
    by_rank: list[tuple[str, str]] = []
    for rank, (a, b) in enumerate(merges):
        if a + b not in ids or a not in ids or b not in ids:
            raise LmdataError(f"merge {rank} ({a!r}, {b!r}): its tokens are not all in the vocab")
        pair = chr(ids[a]) + chr(ids[b])
        if pair not in ranks:  # a repeated merge keeps its first rank
            ranks[pair] = ids[a + b] if ranked else rank
            merged[pair] = chr(ids[a + b])
        by_rank.append((pair, merged[pair]))
    return ranks, merged, by_rank


def _bpe_heap(s: str, ranks: dict[str, int], merged: dict[str, str], one: bool = False) -> tuple[int, ...]:
    """BPE over a linked list with a heap of (rank, position): O(n log n) for long pre-tokens.

    Merges every pair of the lowest rank, left to right, before the pairs those merges
    create enter the heap -- the same result as repeated ``str.replace`` of the best pair,
    even for merge lists where a merged token's pair ranks before its parts.  A heap entry is one int, ``rank << 32 |
    position``, to keep a 1 MB pre-token within ~100 MB.  ``one``: merge one pair, the leftmost of the
    lowest rank, then look again (tiktoken's loop; a ranked tokenizer's merge can make a lower rank).
    """
    sym: list[str | None] = list(s)
    n = len(sym)
    nxt = list(range(1, n + 1))
    prv = list(range(-1, n - 1))
    heap = [ranks[s[i : i + 2]] << 32 | i for i in range(n - 1) if s[i : i + 2] in ranks]
    heapq.heapify(heap)
    mask = (1 << 32) - 1
    while heap:
        rank, touched = heap[0] >> 32, []
        while heap and heap[0] >> 32 == rank:  # one rank at a time, like one str.replace
            i = heapq.heappop(heap) & mask
            j = nxt[i]
            if sym[i] is None or j >= n or ranks.get(sym[i] + sym[j]) != rank:
                continue  # stale: i was merged away or its right neighbour changed
            sym[i] = merged[sym[i] + sym[j]]
            sym[j] = None
            nxt[i] = k = nxt[j]
            if k < n:
                prv[k] = i
            touched += (prv[i], i)
            if one:
                break
        for p in touched:  # the pairs these merges made enter the heap only now
            if p >= 0 and sym[p] is not None and (k := nxt[p]) < n and (r := ranks.get(sym[p] + sym[k])) is not None:
                heapq.heappush(heap, r << 32 | p)
    return tuple(ord(c) for c in sym if c is not None)
