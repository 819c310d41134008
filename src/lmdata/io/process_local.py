"""State that belongs to one process: the one way lmdata keeps open files, pools and caches.

Readers are pickled to loader workers (spawn, forkserver) and inherited by forked ones;
an open file, a thread pool or an S3 client must never cross that line. So every such
value is built where it is used, on first use in each process:

    class Reader:
        handles = per_process(lambda self: {})      # an attribute: each process its own dict
    _filesystems = ProcessLocal(dict)               # a module-level value, the same rule

Both keep the value in a ``_Slot`` tagged with the pid that built it: a forked child sees
the parent's pid and builds its own, and a slot pickles empty, so a worker never receives
the parent's value. Nothing needs a ``__getstate__`` of its own for it.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")

# This process's pid, renewed in a forked child: an attribute read costs no ``getpid`` call
# (a reader's first touch of a shard reads ~9 of them: ~3 us of it went to getpid).
_pid = os.getpid()


def _renew_pid() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_pid)


class _Slot:
    """A value and the pid of the process that built it; pickles empty."""

    __slots__ = ("pid", "value")

    def __init__(self) -> None:
        self.pid, self.value = -1, None

    def __reduce__(self) -> tuple:
        return (_Slot, ())

    def get(self, build: Callable[[], Any]) -> Any:
        if self.pid != _pid:
            self.value, self.pid = build(), _pid
        return self.value

    def peek(self) -> Any:
        """The value if this process built one, else None (builds nothing)."""
        return self.value if self.pid == _pid else None


class ProcessLocal(Generic[T]):
    """A module-level value built by ``build()`` on first use in each process."""

    def __init__(self, build: Callable[[], T]) -> None:
        self._build, self._slot = build, _Slot()

    def get(self) -> T:
        return self._slot.get(self._build)

    def peek(self) -> T | None:
        return self._slot.peek()


class per_process(Generic[T]):  # noqa: N801 - used like ``property``
    """An attribute built by ``build(obj)`` on first access in each process (never pickled);
    assigning to it sets this process's value."""

    def __init__(self, build: Callable[[Any], T]) -> None:
        self._build = build

    def __set_name__(self, owner: type, name: str) -> None:
        self._key = f"_local_{name}"

    def _slot(self, obj: Any) -> _Slot:
        slot = obj.__dict__.get(self._key)
        if slot is None:
            slot = obj.__dict__[self._key] = _Slot()
        return slot

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        if obj is None:
            return self  # type: ignore[return-value]
        slot = obj.__dict__.get(self._key)
        if slot is not None and slot.pid == _pid:  # the hot path: a value this process built
            return slot.value
        return self._slot(obj).get(lambda: self._build(obj))

    def __set__(self, obj: Any, value: T) -> None:
        slot = self._slot(obj)
        slot.value, slot.pid = value, _pid

    def peek(self, obj: Any) -> T | None:
        """``obj``'s value if this process built it, else None."""
        return self._slot(obj).peek()

    def reset(self, obj: Any) -> None:
        """Forget ``obj``'s value in this process (the next access builds a new one)."""
        obj.__dict__.pop(self._key, None)
