"""Lazy package exports: names resolve to their module on first use.

Keeps ``import lmdata.<package>`` free of torch/pyarrow/lance until a name is touched
(STYLE point 7; ``tests/test_package.py`` checks it).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``exports[name]`` (a module path) on first use."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
