"""The one test of "a whole number" that every argument check shares.

``int``, NumPy and other ``numbers.Integral`` values are whole numbers; ``bool`` is not (``True`` had
been a batch of 1), nor a float such as 2.5 (it had been truncated), nor text such as "3".
"""

from __future__ import annotations

import numbers
from typing import Any


def whole(value: Any, least: int | None = None) -> bool:
    """Whether ``value`` is a whole number, and ``>= least`` when given."""
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and (least is None or value >= least))
