"""A number set in the environment, or its default; a value out of range is one line naming the variable."""

from __future__ import annotations

import math
import os
from typing import Callable

from lmdata.errors import SettingError


def env_number(name: str, default: float, valid: Callable[[float], bool], expected: str) -> float:
    """``name``'s value as a float (``default`` when unset or blank); one that is not a number, or that
    ``valid`` refuses, raises ``SettingError("NAME='text': <expected>")``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan  # refused by every range
    if not valid(value):
        raise SettingError(f"{name}={text!r}: {expected}")
    return value
