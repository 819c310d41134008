"""A custom pre-tokenizer regex (or chain of them) compiled for the C matcher (``_fastbpe_regex.c``), GIL-free.

Tokenizer regexes (Llama 3's, Qwen2's, Tekken's, DeepSeek's...) are a leftmost-first
alternation of runs of one-character classes.  This parses that family into a small
backtracking program, so the C encoder pre-tokenizes them without calling Python:

    atoms        one-character classes: ``[...]``, ``\\p{..}``, ``\\P{..}``, ``\\s \\S \\d \\D \\w \\W``,
                 ``.``, escapes, literals; under ``(?i)`` / ``(?i:...)`` too
    quantifiers  ``? * + {m} {m,} {m,n} {,n}`` on a class, greedy, lazy (``?``) or possessive (``+``);
                 on a group only ``?`` (its three forms)
    groups       ``(...)``, ``(?:...)``, ``(?i:...)``, ``(?-i:...)``, atomic ``(?>...)``,
                 look-aheads ``(?=...)`` ``(?!...)``; alternation ``|`` anywhere
    anchors      ``^`` ``\\A`` (start), ``$`` (end, or before a final newline), ``\\z`` ``\\Z`` (end)
    chains       up to 8 such regexes applied one after another (Hugging Face's isolating Splits)

A class's members are computed by the ``regex`` module itself over every code point (a bit
of a 4-byte-per-code-point table; a class of at most 4 characters is a list), so the C side
classifies exactly as ``regex`` does.  A pattern outside this subset (look-behind, a repeated
group, back-references, a pattern that can match the empty string, ...) keeps the Python path;
``compile_pattern`` says why.  ``tests/tokenizer/test_regex_program.py`` checks the programs
against ``regex.findall``.
"""

from __future__ import annotations

import re
from array import array
from functools import lru_cache

import regex

# instruction: 8 int32s [op, next, a, b, c, d, e, 0] (see _fastbpe_regex.c)
SUCCEED, SET, SPLIT, ATOMIC, LOOKNEG, LOOKPOS, BOS, EOS, DOLLAR = range(9)
WIDTH = 8
MAX_TABLE_CLASSES = 32
MAX_LIST = 4
GREEDY, LAZY, POSSESSIVE = 0, 1, 2


class Unsupported(Exception):
    """The pattern is outside the subset the C matcher takes (the message says where)."""


_ESCAPE_ASSERT = {"A": ("assert", BOS), "z": ("assert", EOS), "Z": ("assert", EOS)}
_CLASS_LETTERS = set("sSdDwWnrtfvae")
_QUANT = re.compile(r"\{(\d*)(?:(,)(\d*))?\}")


class _Parser:
    """Recursive descent over the pattern text into a tuple AST."""

    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0

    def fail(self, what: str) -> Unsupported:
        return Unsupported(f"{what} at offset {self.i}")

    def parse(self) -> tuple:
        ci = False
        if self.s.startswith("(?i)"):
            ci, self.i = True, 4
        node = self.alt(ci)
        if self.i != len(self.s):
            raise self.fail("unbalanced ')'")
        return node

    def alt(self, ci: bool) -> tuple:
        branches = [self.seq(ci)]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            branches.append(self.seq(ci))
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def seq(self, ci: bool) -> tuple:
        items = []
        while self.i < len(self.s) and self.s[self.i] not in "|)":
            atom = self.atom(ci)
            items.append(self.quantified(atom))
        return items[0] if len(items) == 1 else ("seq", items)

    def atom(self, ci: bool) -> tuple:
        s, i = self.s, self.i
        c = s[i]
        if c == "(":
            return self.group(ci)
        if c == "[":
            end = self.class_end(i + 1)
            self.i = end
            return ("set", s[i:end], ci)
        if c == "\\":
            return self.escape(ci)
        if c in "*+?{":
            raise self.fail(f"a quantifier {c!r} with nothing to repeat")
        self.i += 1
        if c == "^":
            return ("assert", BOS)
        if c == "$":
            return ("assert", DOLLAR)
        return ("set", c, ci)

    def escape(self, ci: bool) -> tuple:
        s, i = self.s, self.i
        if i + 1 >= len(s):
            raise self.fail("a trailing backslash")
        c = s[i + 1]
        if c in _ESCAPE_ASSERT:
            self.i = i + 2
            return _ESCAPE_ASSERT[c]
        m = re.compile(r"\\(?:[pPxN]\{[^}]*\}|[pP][A-Za-z]|x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|0[0-7]{0,2})"
                       ).match(s, i)
        if m:
            self.i = m.end()
            return ("set", m.group(), ci)
        if c.isalnum() and c not in _CLASS_LETTERS:
            raise self.fail(f"the escape \\{c}")
        self.i = i + 2
        return ("set", s[i:i + 2], ci)

    def class_end(self, j: int) -> int:
        """The offset just past the ``]`` closing a class whose body starts at ``j``."""
        s = self.s
        if j < len(s) and s[j] == "^":
            j += 1
        if j < len(s) and s[j] == "]":
            j += 1
        while j < len(s) and s[j] != "]":
            if s[j] == "\\":
                m = re.compile(r"\\[pPxN]\{[^}]*\}").match(s, j)
                j = m.end() if m else j + 2
            elif s[j] == "[":
                m = re.compile(r"\[:\^?[a-z]+:\]").match(s, j)
                if not m:
                    raise Unsupported(f"a nested set at offset {j}")
                j = m.end()
            else:
                j += 1
        if j >= len(s):
            raise Unsupported("an unclosed '['")
        return j + 1

    def group(self, ci: bool) -> tuple:
        s = self.s
        self.i += 1
        kind = "group"
        m = re.compile(r"\?(-?)i:").match(s, self.i)
        if m:
            ci, self.i = m.group(1) != "-", m.end()
        elif s.startswith("?:", self.i):
            self.i += 2
        elif s.startswith(("?>", "?=", "?!"), self.i):
            kind = {">": "atomic", "=": "lookpos", "!": "lookneg"}[s[self.i + 1]]
            self.i += 2
        elif s.startswith("?", self.i):
            raise self.fail("a group of a kind the C matcher lacks (look-behind, flags, named)")
        body = self.alt(ci)
        if self.i >= len(s) or s[self.i] != ")":
            raise self.fail("an unclosed '('")
        self.i += 1
        return body if kind == "group" else (kind, body)

    def quantified(self, atom: tuple) -> tuple:
        s = self.s
        if self.i >= len(s):
            return atom
        c = s[self.i]
        if c in "?*+":
            lo, hi = {"?": (0, 1), "*": (0, -1), "+": (1, -1)}[c]
            self.i += 1
        elif c == "{":
            m = _QUANT.match(s, self.i)
            if not m or (not m.group(1) and not m.group(3)):
                raise self.fail("a '{' that is not a quantifier")
            lo = int(m.group(1) or 0)
            hi = lo if not m.group(2) else (int(m.group(3)) if m.group(3) else -1)
            if hi != -1 and hi < lo:
                raise self.fail("a quantifier {m,n} with n < m")
            self.i = m.end()
        else:
            return atom
        mode = GREEDY
        if self.i < len(s) and s[self.i] in "?+":
            mode = LAZY if s[self.i] == "?" else POSSESSIVE
            self.i += 1
        if self.i < len(s) and s[self.i] in "?*+{":
            raise self.fail("a repeated quantifier")
        if atom[0] in ("assert", "lookpos", "lookneg"):
            raise self.fail("a quantified assertion")
        return ("rep", atom, lo, hi, mode)


def first(node: tuple) -> frozenset | None:
    """The classes one of which must hold the first character a match of node consumes, or None (node can
    match the empty string, so what follows decides)."""
    kind = node[0]
    if kind == "set":
        return frozenset([(node[1], node[2])])
    if kind == "rep":
        inner = first(node[1])
        return inner if node[2] > 0 else None
    if kind == "atomic":
        return first(node[1])
    if kind == "alt":
        parts = [first(b) for b in node[1]]
        return None if None in parts else frozenset().union(*parts)
    if kind == "seq":
        out: frozenset = frozenset()
        for item in node[1]:
            if item[0] in ("assert", "lookpos", "lookneg"):
                continue  # consumes nothing: the first character is the next item's
            f = first(item[1]) if item[0] == "rep" else first(item)
            if f is None:
                return None
            out |= f
            if not nullable(item):
                return out
        return None
    return None


def nullable(node: tuple) -> bool:
    """Whether the node can match the empty string."""
    kind = node[0]
    if kind == "set":
        return False
    if kind == "rep":
        return node[2] == 0 or nullable(node[1])
    if kind == "seq":
        return all(map(nullable, node[1]))
    if kind == "alt":
        return any(map(nullable, node[1]))
    if kind == "atomic":
        return nullable(node[1])
    return True  # assertions, look-aheads


class _Emitter:
    """The program, built back to front: ``emit(node, k)`` is the pc that matches node, then goes to k."""

    def __init__(self) -> None:
        self.code: list[list[int]] = [[SUCCEED, 0, 0, 0, 0, 0, 0, 0]]
        self.classes: dict[tuple[str, bool], int] = {}  # (source, ci) -> index
        self.sets: list[tuple[str, bool]] = []

    def op(self, op: int, nxt: int = 0, a: int = 0, b: int = 0, c: int = 0, d: int = 0) -> int:
        self.code.append([op, nxt, a, b, c, d, 0, 0])
        return len(self.code) - 1

    def guard(self, branch: tuple) -> tuple[int, int]:
        """(1, class index): a SPLIT skips the branch unless the next character is in that class (the
        union of the classes a match of the branch can start with); (0, 0): no such class."""
        f = first(branch)
        if f is None:
            return 0, 0
        key = next(iter(f)) if len(f) == 1 else f
        if key not in self.classes:
            self.classes[key] = len(self.sets)
            self.sets.append(key)
        return 1, self.classes[key]

    def set_index(self, src: str, ci: bool) -> int:
        key = (src, ci)
        if key not in self.classes:
            self.classes[key] = len(self.sets)
            self.sets.append(key)
        return self.classes[key]

    def emit(self, node: tuple, k: int) -> int:
        kind = node[0]
        if kind == "set":
            return self.op(SET, k, self.set_index(node[1], node[2]), 1, 1, GREEDY)
        if kind == "seq":
            for item in reversed(node[1]):
                k = self.emit(item, k)
            return k
        if kind == "alt":
            pcs = [self.emit(b, k) for b in node[1]]
            pc = pcs[-1]
            for x, branch in zip(reversed(pcs[:-1]), reversed(node[1][:-1])):
                pc = self.op(SPLIT, 0, x, pc, *self.guard(branch))
            return pc
        if kind == "atomic":
            return self.op(ATOMIC, k, self.emit(node[1], 0))
        if kind in ("lookpos", "lookneg"):
            return self.op(LOOKPOS if kind == "lookpos" else LOOKNEG, k, self.emit(node[1], 0))
        if kind == "assert":
            return self.op(node[1], k)
        return self.emit_rep(node, k)

    def emit_rep(self, node: tuple, k: int) -> int:
        _, inner, lo, hi, mode = node
        if hi == 0:
            return k
        if inner[0] == "set":
            return self.op(SET, k, self.set_index(inner[1], inner[2]), lo, hi, mode)
        if hi != 1:
            raise Unsupported("a group repeated more than once (only '?' applies to a group)")
        if mode == POSSESSIVE:
            return self.op(ATOMIC, k, self.emit(("rep", inner, lo, 1, GREEDY), 0))
        if lo == 1:
            return self.emit(inner, k)
        body = self.emit(inner, k)
        return self.op(SPLIT, 0, k, body) if mode == LAZY else self.op(SPLIT, 0, body, k, *self.guard(inner))


@lru_cache(maxsize=None)
def _every() -> str:
    """Every code point 0..0x10FFFF in one str (lone surrogates included)."""
    return array("I", range(0x110000)).tobytes().decode("utf-32-le", "surrogatepass")


@lru_cache(maxsize=256)
def members(src: str, ci: bool) -> tuple[tuple[int, int], ...]:
    """The runs [a, b) of code points the one-character class ``src`` matches, by ``regex`` itself."""
    pat = regex.compile(("(?i:" if ci else "(?:") + src + ")+")
    return tuple(m.span() for m in pat.finditer(_every()))


def _runs(key) -> tuple[tuple[int, int], ...]:
    """The member runs of a class (src, ci) or of a union of them (a frozenset: a SPLIT's guard)."""
    if isinstance(key, tuple):
        return members(*key)
    import numpy as np

    mask = np.zeros(0x110001, dtype=bool)
    for src, ci in key:
        for a, b in members(src, ci):
            mask[a:b] = True
    edges = np.flatnonzero(np.diff(np.concatenate([[False], mask[:0x110000], [False]]).astype(np.int8)))
    return tuple(zip(edges[::2].tolist(), edges[1::2].tolist()))


def assemble(sets: list, code: list[list[int]]) -> tuple[bytes, bytes | None]:
    """The program's int32 code (lists of small classes appended) and its class table (or None).  Guards
    (unions, for SPLITs) that find no table bit left are dropped: they only save time."""
    import numpy as np

    table = None
    n_table = 0
    lists: list[int] = []
    # per set: (0 = table bit | 1 = list | -1 = none, bit or list offset)
    kinds: list[tuple[int, int]] = [(-1, 0)] * len(sets)
    order = sorted(range(len(sets)), key=lambda i: isinstance(sets[i], frozenset))  # classes before guards
    for i in order:
        runs = _runs(sets[i])
        size = sum(b - a for a, b in runs)
        if size <= MAX_LIST:
            kinds[i] = (1, len(code) * WIDTH + len(lists))
            lists += [size] + [c for a, b in runs for c in range(a, b)]
            continue
        if n_table == MAX_TABLE_CLASSES:
            if isinstance(sets[i], frozenset):
                continue
            raise Unsupported(f"more than {MAX_TABLE_CLASSES} distinct character classes")
        if table is None:
            table = np.zeros(0x110000, dtype=np.uint32)
        for a, b in runs:
            table[a:b] |= np.uint32(1 << n_table)
        kinds[i] = (0, n_table)
        n_table += 1
    flat = array("i")
    for ins in code:
        if ins[0] == SET:
            kind, arg = kinds[ins[2]]
            ins = [SET, ins[1], kind, arg, ins[3], ins[4], ins[5], 0]
        elif ins[0] == SPLIT:
            kind, arg = kinds[ins[5]] if ins[4] else (-1, 0)  # ins[4]: 1 = guarded by class ins[5]
            ins = [SPLIT, 0, ins[2], ins[3], kind, arg, 0, 0]
        flat.extend(ins)
    flat.extend(lists)
    return flat.tobytes(), None if table is None else table.astype("<u4").tobytes()


MAX_STEPS = 8
MAX_INSTR = 1 << 14


def compile_pattern(text: "str | list[str] | tuple[str, ...]") -> tuple[bytes, int, list[int], bytes | None]:
    """``(code, n_instr, entries, table)`` for ``_fastbpe.Program`` from a regex or a chain of them (one
    entry each), or Unsupported naming what is outside the subset."""
    steps = [text] if isinstance(text, str) else list(text)
    if len(steps) > MAX_STEPS:
        raise Unsupported(f"a chain of more than {MAX_STEPS} regexes")
    em = _Emitter()
    entries = []
    for step in steps:
        if regex.compile(step).flags & (regex.VERSION1 | regex.VERBOSE | regex.MULTILINE | regex.DOTALL
                                        | regex.FULLCASE | regex.ASCII | regex.WORD | regex.LOCALE):
            raise Unsupported("a global flag other than (?i)")
        ast = _Parser(step).parse()
        if nullable(ast):
            raise Unsupported("a pattern that can match the empty string")
        entries.append(em.emit(ast, 0))
    if len(em.code) > MAX_INSTR:  # (the matcher recurses along a path of the program)
        raise Unsupported(f"more than {MAX_INSTR} instructions")
    code, table = assemble(em.sets, em.code)
    return code, len(em.code), entries, table


_told: set[str] = set()


def reference(steps: tuple[str, ...], text: str) -> list[str]:
    """What ``regex`` makes of text: one regex's matches, or a chain's pieces (``Pattern._chain_findall``)."""
    if len(steps) == 1:
        return [m.group() for m in regex.finditer(steps[0], text)]
    pieces = [text]
    for step in steps:
        out = []
        for piece in pieces:
            at = 0
            for m in regex.finditer(step, piece):
                if m.start() > at:
                    out.append(piece[at:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                    at = m.end()
            if at < len(piece):
                out.append(piece[at:])
        pieces = out
    return pieces


@lru_cache(maxsize=64)
def program(steps: tuple[str, ...], probe: str):
    """The ``_fastbpe.Program`` of a custom pattern (or chain), or None: outside the subset (said once per
    process, in one line on stderr), or no C accelerator.  ``probe`` is cut by both, as a check."""
    try:
        from lmdata.tokenizer import _fastbpe
    except ImportError:
        return None
    text = steps[0] if len(steps) == 1 else repr(list(steps))
    try:
        prog = _fastbpe.Program(*compile_pattern(steps))
        if prog.findall(probe) != reference(steps, probe):
            raise Unsupported("a mismatch against the regex module on the probe text")
    except (Unsupported, regex.error, ValueError) as exc:
        import multiprocessing

        if text not in _told and multiprocessing.parent_process() is None:  # (not again in each pool worker)
            _told.add(text)
            import sys

            shown = text if len(text) <= 80 else text[:77] + "..."
            print(f"lmdata: pattern '{shown}' has {exc}, outside the C pre-tokenizer's subset: it pre-tokenizes "
                  "in Python (regex module, GIL held)", file=sys.stderr)
        return None
    return prog
