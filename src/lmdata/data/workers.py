"""The loader's workers: which samples each is reading (``InFlight``), reads on threads for
scripts whose worker processes cannot start (``ThreadReads``), and what a dead worker held.

A worker killed mid-read (segfault, OOM kill) leaves no traceback: the main process names
the samples it died on from the ``InFlight`` board (``worker_held``).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import select
import time
import weakref
from typing import Any, Iterator

import torch


class InFlight:
    """Records in shared memory which indices each worker is reading, for post-mortems.

    A worker killed mid-read (segfault, OOM kill) leaves no traceback; the main process
    reads this board to name the samples it died on. One slot per worker:
    ``[count, index_0, ..., index_{B-1}]``; count 0 = idle.
    """

    def __init__(self, dataset: Any, num_workers: int, batch_size: int, start_method: str | None) -> None:
        import multiprocessing as mp

        self.dataset, self.width = dataset, batch_size + 1
        self.board = mp.get_context(start_method).RawArray("q", num_workers * self.width)

    def __getitems__(self, indices: list[int]) -> Any:
        info = torch.utils.data.get_worker_info()
        slot = self.width * (info.id if info is not None else 0)
        self.board[slot + 1:slot + 1 + len(indices)] = indices
        self.board[slot] = len(indices)
        out = self.dataset.__getitems__(indices)
        self.board[slot] = 0
        return out

    def __getitem__(self, index: int) -> Any:
        return self.__getitems__([index])

    def reading(self) -> dict[int, list[int]]:
        """Index lists being read right now, by worker id (busy workers only)."""
        slots = [self.board[i:i + self.width] for i in range(0, len(self.board), self.width)]
        return {w: list(s[1:1 + s[0]]) for w, s in enumerate(slots) if s[0] > 0}


class ThreadReads:
    """The DataLoader's reads on ``num_workers`` threads, in order, ``num_workers * prefetch`` ahead.

    For a script without an ``if __name__ == "__main__":`` guard whose workers would have to
    be spawned (``lmdata._mp``): such workers re-run the script and die. Each thread reads
    its own unpickled copy of the dataset (as a worker process would); Lance takes, Parquet
    decoding and memmap copies release the GIL, so the reads still overlap the training step.
    """

    def __init__(self, source: Any, sampler: Any, num_workers: int, prefetch: int) -> None:
        self.source, self.sampler, self.num_workers, self.depth = source, sampler, num_workers, num_workers * prefetch

    def __iter__(self) -> Iterator[Any]:
        import pickle
        import threading
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        blob, local = pickle.dumps(self.source), threading.local()

        def read(indices: list[int]) -> Any:
            if not hasattr(local, "source"):
                local.source = pickle.loads(blob)
            return local.source.__getitems__(indices)

        pool, pending = ThreadPoolExecutor(self.num_workers, thread_name_prefix="lmdata-loader"), deque()
        try:
            for indices in self.sampler:
                pending.append(pool.submit(read, indices))
                if len(pending) >= self.depth:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
            pool.shutdown(wait=True)


LIVENESS_S = 1.0  # how often a wait for a worker's read checks that the workers are alive


@contextlib.contextmanager
def gc_frozen_for_fork(workers: int, context: Any) -> Iterator[None]:
    """Fork workers with the parent's objects frozen out of the cyclic GC (``gc.freeze``).

    A forked worker shares the parent's pages until it writes them, and a GC pass writes the
    header of every object it visits: each worker's first collections copied ~35 MB of the
    parent's heap (torch, numpy, lmdata), and PSS at 2 workers was 326 MB, against 258 with
    this (memmap store, 129 M tokens, 220 batches). The workers keep the frozen state they
    were forked with; the parent unfreezes at once, so its own garbage is still collected
    (its next pass copies its pages once: ~290 MB in all). A caller that froze objects itself
    manages freezing, and is left alone.
    """
    if not forks_workers(workers, context) or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def forks_workers(workers: int, context: Any) -> bool:
    """Whether a DataLoader with ``workers`` and this multiprocessing ``context`` forks this process."""
    if context is not None:
        method = context.get_start_method()
    else:  # the default context's, without fixing it (``get_start_method()`` would)
        method = mp.get_start_method(allow_none=True) or mp.get_all_start_methods()[0]
    return bool(workers) and method == "fork"


def check_workers_while_waiting(it: Any) -> None:
    """Make a DataLoader iterator look at its workers every ``LIVENESS_S`` while it waits for a read.

    With a ``timeout`` set, torch waits for a read with one ``timeout``-long get and checks its
    workers only after it. A forked worker's death reaches the main process sooner as SIGCHLD,
    but forkserver's workers (Lance, once its runtime runs here) are not its children: a
    killed one was noticed 300 s later (issue 29.12). The wait becomes torch's own short
    checks (``_try_get_data``: "worker ... exited unexpectedly") up to the same deadline.
    Another torch without these internals keeps its own wait.
    """
    timeout = getattr(it, "_timeout", 0)
    if not timeout or not hasattr(it, "_try_get_data") or getattr(it, "_pin_memory", False):
        return
    owner = weakref.ref(it)  # not the iterator itself: a cycle would outlive ``del`` and its workers

    def get_data() -> Any:
        deadline = time.monotonic() + timeout
        while True:
            ok, data = owner()._try_get_data(max(min(LIVENESS_S, deadline - time.monotonic()), 0.001))  # a dead worker raises
            if ok:
                return data
            if time.monotonic() >= deadline:
                raise RuntimeError(f"DataLoader timed out after {timeout} seconds")

    it._get_data = get_data


def exit_with_owner(owner: int, worker_id: int) -> None:
    """Worker init: end this worker as soon as process ``owner`` (the loader's) is gone.

    A forked worker is its owner's child, and torch's watchdog ends it when its parent
    changes. A forkserver worker's parent is the server, which lives on -- the workers hold
    the descriptor whose closing would end it: a SIGKILLed or SIGTERMed trainer left its
    Lance workers, the server and the resource tracker running as orphans (issue 29.12).
    Here a thread waits on the owner's pidfd (else polls its pid) and exits the worker; the
    server and the tracker then see their last client go and exit too.
    """
    import threading

    if os.getppid() != owner:
        threading.Thread(target=_await_exit, args=(owner,), name="lmdata-owner-watch", daemon=True).start()


def _await_exit(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)  # Linux >= 5.3: readable once the process has exited
    except ProcessLookupError:
        os._exit(0)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        waiter = select.poll()  # not select.select: a descriptor past 1023 is out of its reach
        waiter.register(fd, select.POLLIN)
        waiter.poll()
    else:
        while _alive(pid):
            time.sleep(LIVENESS_S)
    os._exit(0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


worker_deaths: list[RuntimeError] = []  # dead-worker errors torch's SIGCHLD handler raised, kept for next()
in_next: list[bool] = []  # non-empty while a loader waits in next(): a death then raises at once


def defer_sigchld_errors() -> None:
    """Keep torch's dead-worker error for the loader's next batch instead of raising it anywhere.

    torch's SIGCHLD handler raises "DataLoader worker ... is killed by signal" wherever the main
    thread happens to be -- mostly in the training step, far from the loader, so the error
    named no samples and left a traceback. Wrapped, the error waits in
    ``worker_deaths`` for the next ``next()``, which explains it (``TokenLoader._explain``).
    While a loader waits in ``next()`` the error is raised at once, as before: with a read
    ``timeout`` torch's own liveness check would wait that long.
    """
    import signal
    import threading

    if not hasattr(signal, "SIGCHLD") or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGCHLD)
    if not callable(previous) or getattr(previous, "lmdata_deferred", False):
        return

    def handler(signum: int, frame: Any) -> None:
        try:
            previous(signum, frame)
        except RuntimeError as exc:
            if in_next:
                raise
            worker_deaths.append(exc)

    handler.lmdata_deferred = True  # type: ignore[attr-defined]
    signal.signal(signal.SIGCHLD, handler)


def shown(ids: list[int]) -> str:
    """The first few of ``ids`` (a message names samples, it does not list thousands)."""
    return f"{ids[:8]}{f'... ({len(ids)} in all)' if len(ids) > 8 else ''}"


def worker_held(worker: int, reading: list[int], held: list[int], what: str) -> str:
    """What a dead worker took with it: the read it was in, the reads queued for it."""
    queued = [i for i in held if i not in set(reading)]
    if not reading and not queued:
        return f"worker {worker} died between reads, holding no {what}"
    parts = [f"was reading {what} {shown(reading)}"] if reading else []
    parts += [f"held {what} {shown(queued)} queued for it"] if queued else []
    return f"worker {worker} " + " and ".join(parts)
