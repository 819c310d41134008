"""The character classes the C pre-tokenizers need, taken from the ``regex`` module itself.

One byte per code point (1.1 MB), bit flags: \\s, \\p{L}, \\p{N}, o200k's "upper" set
[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}] and "lower" set [\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}].  Built from
``regex``'s own Unicode tables, so the C path classifies every character exactly as the
regex does; ~0.35 s, once per process, the first time a C encoder is made.
"""

from __future__ import annotations

import regex

CLASSES = (r"\s", r"\p{L}", r"\p{N}", r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]")
_installed: set[int] = set()


def table() -> bytes:
    """The class byte of every code point 0..0x10FFFF (bit k: ``CLASSES[k]``)."""
    from array import array

    # every code point in one str, without a list of 1.1 M one-character strs (~60 MB)
    every = array("I", range(0x110000)).tobytes().decode("utf-32-le", "surrogatepass")
    out = bytearray(0x110000)
    for bit, cls in enumerate(CLASSES):
        flag = bytes([1 << bit])
        for m in regex.finditer(cls + "+", every):
            a, b = m.span()
            out[a:b] = (int.from_bytes(out[a:b], "little") | int.from_bytes(flag * (b - a), "little")).to_bytes(
                b - a, "little")
    return bytes(out)


def install(module) -> None:
    """Give the C module its table, once per process."""
    if id(module) not in _installed:
        module.set_classes(table())
        _installed.add(id(module))
