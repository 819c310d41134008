"""Progress that fits where it goes: a tqdm bar on a terminal, plain lines in a log.

``progress(show, **tqdm_kwargs)`` returns a tqdm bar when ``show`` and stderr is a
terminal. When stderr is a pipe or a file it returns ``PlainProgress``: the same calls
(``update``, ``set_postfix_str``, ``set_postfix``, ``write``, ``close``, iteration, ``with``),
printing one whole line (no ``\\r``) at most every ``LMDATA_PROGRESS_SECONDS`` seconds
(default 5), so ``grep`` over ``lmdata ... > log 2>&1`` finds every log line intact.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

from lmdata.io.env import env_number

INTERVAL_ENV = "LMDATA_PROGRESS_SECONDS"


def is_terminal(stream: Any = None) -> bool:
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def progress(show: bool, iterable: Iterable | None = None, **kwargs: Any) -> Any:
    """A progress reporter on stderr: tqdm on a terminal, ``PlainProgress`` elsewhere, silent if not ``show``."""
    if show and is_terminal():
        from tqdm import tqdm

        return tqdm(iterable, file=sys.stderr, dynamic_ncols=True, **kwargs)
    return PlainProgress(iterable, disable=not show, **kwargs)


def _size(n: float, unit: str, scale: bool) -> str:
    if not scale:
        return f"{n:,.0f} {unit}"
    for prefix in ("", "k", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.1f} {prefix}{unit}"
        n /= 1000
    return f"{n:.1f} P{unit}"


class PlainProgress:
    """tqdm's interface as a plain line every few seconds (``desc: n/total unit (pct), rate, postfix``)."""

    def __init__(self, iterable: Iterable | None = None, *, desc: str = "", total: float | None = None,
                 initial: float = 0, unit: str = "it", unit_scale: bool = False, disable: bool = False,
                 **_: Any) -> None:
        self.iterable, self.desc, self.total, self.n = iterable, desc, total, initial
        self.unit, self.unit_scale, self.disable = unit, unit_scale, disable
        self.postfix = ""
        self.interval = env_number(INTERVAL_ENV, 5.0, lambda v: 0 <= v < math.inf,
                                   "give the seconds between progress lines, a number >= 0")
        self._start = self._last = time.monotonic()
        self._start_n = initial

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update(1)

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        self.n += n
        now = time.monotonic()
        if not self.disable and now - self._last >= self.interval:
            self._last = now
            self._print(now)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def set_postfix(self, **kwargs: Any) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in kwargs.items())

    def write(self, line: str) -> None:
        print(line, flush=True)

    def close(self) -> None:
        """Nothing: the command's own summary line says how it ended."""

    def _print(self, now: float) -> None:
        if self.unit_scale:  # bytes: "1.2 MB of 4.0 MB (30%), 0.8 MB/s"
            done = _size(self.n, self.unit, True) + (f" of {_size(self.total, self.unit, True)}" if self.total else "")
        else:  # counts: "3/6 step (50%), 1.2 step/s"
            done = f"{self.n:,.0f}" + (f"/{self.total:,.0f}" if self.total else "") + f" {self.unit}"
        if self.total:
            done += f" ({self.n / self.total:.0%})"
        rate = (self.n - self._start_n) / max(now - self._start, 1e-9)
        speed = f"{_size(rate, self.unit, True)}/s" if self.unit_scale else f"{rate:,.1f} {self.unit}/s"
        parts = [f"{self.desc}: {done}" if self.desc else done, speed]
        print(", ".join(parts + ([self.postfix] if self.postfix else [])), file=sys.stderr, flush=True)
