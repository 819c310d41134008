"""A guard for the Ray that an ingest started itself: its processes end with the ingest.

Why: ``ray.init()`` without an address starts a private Ray (GCS, raylet, workers). A
driver that exits normally shuts it down; a driver killed with SIGKILL (the OOM killer, a
scheduler's hard stop) cannot, and its workers finish the task they are in before they
notice the raylet is gone (measured: a worker in a long task outlived its killed driver by
over a minute; in an ingest, ~20 s). ``Reaper`` is a small process that holds the read end
of a pipe from the driver: the kernel closes the pipe when the driver dies however it
dies, and the reaper then SIGKILLs the private Ray's processes and their descendants (by
pid and start time, surveyed every 0.5 s under the processes ``ray.init`` started: the
raylet's agents are orphaned the moment the driver dies, so they are known beforehand;
and any process whose command line names the Ray session's directory). A normal ``stop`` tells it to exit
without killing anything. Linux only (it walks ``/proc``); elsewhere it is not started.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

# Runs in the reaper process: argv are the private Ray's own processes (GCS, raylet, ...).
_WATCH = r"""
import os, select, signal, sys
def table():  # pid -> (parent pid, start time) of every process, from /proc/*/stat
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            found[int(name)] = (int(fields[1]), fields[19])
    return found
def started(pid):  # the start time tells a process from a later one given the same pid
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None
known = {}
def survey():  # the processes under the roots now (the raylet's children die orphaned with it)
    procs = table()
    grew = True
    while grew:
        grew = False
        for pid, (parent, t) in procs.items():
            if pid not in known and parent in known and procs.get(parent, (0, None))[1] == known[parent]:
                known[pid] = t
                grew = True
session = sys.argv[1]  # the Ray session's directory: named in its processes' command lines
for p in sys.argv[2:]:
    if (t := started(int(p))) is not None:
        known[int(p)] = t
survey()
print("ready", flush=True)
while not select.select([sys.stdin], [], [], 0.5)[0]:
    survey()
if os.read(sys.stdin.fileno(), 16):  # the driver said "stop": it shut Ray down itself
    sys.exit(0)
survey()
for pid in table():  # orphaned before a survey saw them: the processes of this session, by its directory
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if session.encode() in fh.read() and pid != os.getpid():
                known.setdefault(pid, started(pid))
    except OSError:
        pass
for pid, t in known.items():
    if started(pid) == t:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""


def ray_processes() -> tuple[str, list[int]]:
    """(the session directory, the pids of the processes) of the Ray this driver's ``ray.init``
    started (no pids if it started none)."""
    import ray

    node = getattr(getattr(getattr(ray, "_private", None), "worker", None), "_global_node", None)
    procs = getattr(node, "all_processes", None) or {}
    pids = [int(p.process.pid) for group in procs.values() for p in group if getattr(p, "process", None)]
    return str(getattr(node, "get_session_dir_path", lambda: "")() or ""), pids


class Reaper:
    """Kills the private Ray's processes if this process dies before ``stop`` (see the module docstring)."""

    def __init__(self, session: str, pids: list[int]) -> None:
        self.proc: Any = None
        if sys.platform.startswith("linux") and pids and session:
            self.proc = subprocess.Popen([sys.executable, "-c", _WATCH, session, *map(str, pids)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         start_new_session=True, close_fds=True)
            self.proc.stdout.readline()  # "ready": it has seen Ray's processes (or it died: "")

    def stop(self) -> None:
        """Ray was shut down normally: the reaper exits without killing anything."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.write(b"stop")
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait()
        self.proc = None
