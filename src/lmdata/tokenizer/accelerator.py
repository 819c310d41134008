"""Whether the tokenizer's C accelerator (``lmdata.tokenizer._fastbpe``) is built and in use.

Built without a C compiler, lmdata encodes in pure Python (same ids, ~6x slower): the first
``Tokenizer`` of a process says so with a RuntimeWarning naming the fix, ``lmdata --version``
says which path is in use, and ``LMDATA_PURE_PYTHON=1`` picks pure Python without a warning.
"""

from __future__ import annotations

import os


def built() -> bool:
    try:
        from lmdata.tokenizer import _fastbpe  # noqa: F401
    except ImportError:
        return False
    return True


PURE_ENV = "LMDATA_PURE_PYTHON"
NOT_BUILT = ("lmdata's C tokenizer accelerator (lmdata.tokenizer._fastbpe) is not built, so encoding runs in pure "
             "Python, ~6x slower; fix: install a C compiler (build-essential, Xcode command-line tools, MSVC) and "
             "reinstall lmdata from source (pip install --force-reinstall --no-binary lmdata lmdata), or install a "
             f"wheel that has it; set {PURE_ENV}=1 to use pure Python without this warning")
_warned = False


def pure_python_forced() -> bool:
    return os.environ.get(PURE_ENV, "") not in ("", "0")


def accelerator_status() -> str:
    """For ``lmdata --version``: whether the C accelerator is in use, and if not, why."""
    if not built():
        return "C tokenizer accelerator: NOT BUILT (pure Python, ~6x slower; see `pip install -v` output)"
    if pure_python_forced():
        return f"C tokenizer accelerator: built, off ({PURE_ENV}=1)"
    return "C tokenizer accelerator: in use"


def warn_not_built(is_built: bool) -> None:
    """Once per process, at first use: the missing accelerator and how to get it (silent when
    ``LMDATA_PURE_PYTHON=1`` asks for pure Python, or when the accelerator is there)."""
    global _warned
    if not _warned and not is_built and not pure_python_forced():
        _warned = True
        import warnings

        warnings.warn(NOT_BUILT, RuntimeWarning, stacklevel=4)
