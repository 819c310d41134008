"""Damage a Lance data file where it stores a token: its ``tokens`` values are raw little-endian."""

from __future__ import annotations

import numpy as np


def flip_stored_token(data: bytearray, stream: np.ndarray, t: int) -> None:
    """Flip a bit of token ``t`` of the uint16 ``stream`` in ``data`` (a Lance file's bytes), found by
    the 16 tokens around it, which must occur exactly once (the one uncompressed column)."""
    pattern = stream[t - 8: t + 8].astype("<u2").tobytes()
    at = [i for i in range(len(data)) if data.startswith(pattern, i)]
    assert len(at) == 1, at
    data[at[0] + 16] ^= 0x10
