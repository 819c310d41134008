"""Lance's loader workers, forked from a forkserver, dying and outliving (issue 29.12).

Once Lance's runtime runs in the main process, the loader starts its workers from a
forkserver, so they are not the main process's children: no SIGCHLD reports a death.

- A worker SIGKILLed (as the OOM killer does) was noticed only when the read timeout fired
  (300 s); now within seconds, naming the worker's samples.
- The owner SIGKILLed or SIGTERMed left the workers, the forkserver and the resource
  tracker running as orphans (all four still there 20 s later); now all of them go.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lmdata.data import TokenDataset, make_loader
from lmdata.errors import LmdataError
from lmdata.io.bounded import Bounded
from lmdata.store import open_store

REPO = Path(__file__).resolve().parents[2]
HANG_S = 60  # the loader's own read timeout is 300 s: noticing a death only then is the bug
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _lance_dataset(store: Path) -> TokenDataset:
    ds = TokenDataset(open_store(store).reader("train", "lance"), 16)
    ds.batch([0, 1])  # Lance's runtime now runs here: workers come from a forkserver
    return ds


def test_a_killed_forkserver_worker_is_reported_within_seconds(sample_store):
    loader = make_loader(_lance_dataset(sample_store), 2, num_workers=2, batches_per_read=1)
    it = iter(loader)
    for _ in range(3):
        next(it)
    workers = loader._dl._iterator._workers
    assert type(workers[0]._popen).__name__ == "Popen" and "forkserver" in type(workers[0]._popen).__module__
    os.kill(workers[1].pid, signal.SIGKILL)
    rest = Bounded(lambda: sum(1 for _ in it))
    assert rest.wait(HANG_S), f"the loader still waited {HANG_S} s after its worker was killed"
    with pytest.raises(LmdataError) as info:
        rest.result()
    text = str(info.value)
    assert "\n" not in text and f"pid(s) {workers[1].pid}) exited unexpectedly" in text and "worker 1 " in text, text


OWNER = """
    import sys
    from lmdata.data import TokenDataset, make_loader
    from lmdata.store import open_store

    def main():
        ds = TokenDataset(open_store(sys.argv[1]).reader("train", "lance"), 16)
        ds.batch([0, 1])
        loader = make_loader(ds, 2, num_workers=2, batches_per_read=1)
        n = 0
        while True:
            for _ in loader:
                n += 1
                if n == 5:
                    print("ready", flush=True)

    if __name__ == "__main__":
        main()
"""


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
        except (OSError, IndexError, ValueError):
            pass
    return out


def _descendants(pid: int) -> list[int]:
    return [d for c in _children(pid) for d in (c, *_descendants(c))]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@linux
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_workers_forkserver_and_tracker_end_with_their_owner(sample_store, tmp_path, sig):
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(OWNER))
    proc = subprocess.Popen([sys.executable, str(script), str(sample_store)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO / "src")}, start_new_session=True)
    left: list[int] = []
    try:
        assert proc.stdout.readline().strip() == "ready"
        left = _descendants(proc.pid)
        names = [Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace") for p in left]
        assert sum("forkserver" in n for n in names) == 3 and sum("resource_tracker" in n for n in names) == 1, names
        proc.send_signal(sig)
        proc.wait(timeout=30)
        deadline = time.monotonic() + HANG_S
        while (left := [p for p in left if _running(p)]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"still running {HANG_S} s after the owner's {sig.name}: {left}"
    finally:
        for pid in [proc.pid, *_descendants(proc.pid), *left]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


def test_the_liveness_check_leaves_no_cycle_that_keeps_workers_alive(sample_store, monkeypatch):
    """The patched wait must not hold its iterator: a cycle outlived ``del`` until a garbage
    collection, and the collected iterator then waited 5 s per worker for its shutdown (every
    loader's teardown took 10 s; the demo's bench 18 of them)."""
    import gc
    import weakref

    import lmdata.data.loader as loader_module
    from lmdata.data import workers

    seen: list[weakref.ref] = []

    def spy(it):
        seen.append(weakref.ref(it))
        workers.check_workers_while_waiting(it)

    monkeypatch.setattr(loader_module, "check_workers_while_waiting", spy)
    ds = TokenDataset(open_store(sample_store).reader("train", "memmap"), 16)
    batches = iter(make_loader(ds, 4, num_workers=2, seed=0))
    next(batches)
    assert seen and seen[0]() is not None
    gc.disable()
    try:
        batches.close()
        del batches
        assert seen[0]() is None, "the DataLoader iterator survived its last reference (a reference cycle)"
    finally:
        gc.enable()
