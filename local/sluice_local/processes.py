"""Child processes that never outlive the local stack.

Each container process (a job's `sluice ...`, an endpoint's server, a transform driver) starts in
its own process group under a small launcher (`preexec_fn` is not safe in the stack's threaded
process) that holds a parent-death signal: when the stack dies, even by `kill -9`, the kernel
signals the launcher, which kills its whole group: the command and everything the command started
(vLLM's engine and worker processes are spawned children of `sluice serve` that would otherwise
outlive it). The launcher passes SIGTERM/SIGINT on to the command and exits as the command did.
Linux sends the signal when the *thread* that started the child ends, so every child is started
from one thread that lives as long as the process. The stack records every group it starts
(leader PID and start time) and, when it starts again, kills whatever is left of the groups a
stack that did not stop cleanly recorded (a launcher killed outright leaves its command's
children). Processes are identified by PID, process group and start time, never by name.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def guarded(cmd: list[str]) -> list[str]:
    """`cmd` behind the launcher that arms the parent-death signal."""
    return [sys.executable, "-m", "sluice_local.processes", str(os.getpid()), *cmd]


_requests: queue.Queue = queue.Queue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _spawn_forever() -> None:
    while True:
        start, answer = _requests.get()
        try:
            answer.put((start(), None))
        except BaseException as e:  # handed to the caller, raised there
            answer.put((None, e))


def popen(cmd: list[str], **kwargs) -> subprocess.Popen:
    """`subprocess.Popen(cmd, start_new_session=True, **kwargs)`, killed when this process dies
    and recorded in the stack's registry (if it has one)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = threading.Thread(target=_spawn_forever, name="sluice-spawner", daemon=True)
            _spawner.start()
    answer: queue.Queue = queue.Queue(1)
    _requests.put(
        (lambda: subprocess.Popen(guarded(cmd), start_new_session=True, **kwargs), answer)
    )
    proc, error = answer.get()
    if error is not None:
        raise error
    track(proc.pid)
    return proc


def die_with(parent: int, sig: int = signal.SIGKILL) -> None:
    """Send `sig` to this process when `parent` dies (Linux; elsewhere nothing); the setting
    survives exec, not fork."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:  # it died before the signal was armed
        os._exit(1)


def supervise(parent: int, cmd: list[str]) -> None:
    """The launcher: run `cmd` in this process group; when `parent` dies, kill the whole group.

    The stack's death arrives as SIGHUP (the launcher is in its own session: no terminal sends
    it); SIGTERM and SIGINT are the stack asking the command to stop, and are passed on. The
    command also dies if the launcher is killed outright (its own parent-death signal).
    """
    signal.signal(signal.SIGHUP, lambda *_: os.killpg(0, signal.SIGKILL))
    die_with(parent, signal.SIGHUP)
    me = os.getpid()
    child = subprocess.Popen(cmd, preexec_fn=lambda: die_with(me))  # the launcher has no threads
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    rc = child.wait()
    for pid in _pids():  # whatever the command left behind in the group goes with it
        if pid != me and group_of(pid) == me:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if rc < 0:  # it died of a signal: so does the launcher, and the caller sees the same status
        signal.signal(-rc, signal.SIG_DFL)
        os.kill(me, -rc)
    sys.exit(rc)


# the stack's registry, once it has one (the transform driver and tests run without)
_registry: Registry | None = None


def use(path: Path) -> list[int]:
    """Record this stack's groups in `path`, after killing what a previous stack left there."""
    global _registry
    _registry = Registry(path)
    return _registry.reap()


def track(pid: int) -> None:
    if _registry is not None:
        _registry.add(pid)


def untrack(pid: int) -> None:
    if _registry is not None:
        _registry.discard(pid)


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields from the state on (the name may hold spaces and parentheses)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def group_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[2]) if fields else None


def alive(pid: int) -> bool:
    """Running or sleeping: not gone, not a zombie waiting to be reaped."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


class Registry:
    """The process groups this stack started, on disk (`<state>/processes.json`)."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()

    def _read(self) -> dict[str, int]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def _write(self, groups: dict[str, int]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.path)

    def add(self, pid: int) -> None:
        """Record a group leader (started with a new session: its PID is the group's ID)."""
        ticks = start_time(pid)
        if ticks is None:
            return
        with self.lock:
            groups = self._read()
            groups[str(pid)] = ticks
            self._write(groups)

    def discard(self, pid: int) -> None:
        with self.lock:
            groups = self._read()
            if groups.pop(str(pid), None) is not None:
                self._write(groups)

    def reap(self) -> list[int]:
        """Kill what is left of every recorded group; returns the PIDs killed.

        A process belongs to a recorded group if its process group is the leader's PID and it
        started no earlier than the leader. Linux does not reuse a PID while a group of that ID
        has members, so a survivor cannot be confused with a newer process of the same PID."""
        with self.lock:
            groups = self._read()
            killed: list[int] = []
            for leader, ticks in groups.items():
                for pid in _pids():
                    if (
                        group_of(pid) == int(leader)
                        and (start_time(pid) or -1) >= ticks
                        and alive(pid)
                    ):
                        try:
                            os.kill(pid, signal.SIGKILL)
                            killed.append(pid)
                        except ProcessLookupError:
                            pass
            self._write({})
            return killed


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


if __name__ == "__main__":  # python -m sluice_local.processes PARENT_PID CMD...
    supervise(int(sys.argv[1]), sys.argv[2:])
