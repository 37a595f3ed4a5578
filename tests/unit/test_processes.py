"""Child processes never outlive the local stack: killed with it, reaped by the next one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sluice_local import processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl")

# A stand-in for the stack: it starts a container process the way the stack does (its own group,
# guarded, recorded), the container starts a worker in its group, then everybody waits.
STACK = textwrap.dedent(
    """
    import subprocess, sys, threading, time
    from pathlib import Path
    from sluice_local import processes
    processes.use(Path(sys.argv[1]))
    worker = "import subprocess, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"
    # started from a thread that then ends, as the stack's runners do
    box = []
    t = threading.Thread(target=lambda: box.append(processes.popen([sys.executable, "-c", worker])))
    t.start()
    t.join()
    print(box[0].pid, flush=True)
    time.sleep(600)
    """
)


def members(group: int) -> list[int]:
    return [p for p in processes._pids() if processes.group_of(p) == group and processes.alive(p)]


def wait_for(check, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_a_killed_stack_takes_its_container_along_and_the_next_one_reaps_the_rest(tmp_path):
    registry = tmp_path / "processes.json"
    stack = subprocess.Popen(
        [sys.executable, "-c", STACK, str(registry)], stdout=subprocess.PIPE, text=True
    )
    container = int(stack.stdout.readline())
    # the launcher, the container's command and the worker the command started
    assert wait_for(lambda: len(members(container)) == 3)
    assert str(container) in registry.read_text()
    time.sleep(0.5)  # the thread that started it has ended; the process it started lives on
    assert processes.alive(container)

    stack.send_signal(signal.SIGKILL)
    stack.wait()
    # the parent-death signal: the container's whole group dies with the stack, however it died
    assert wait_for(lambda: not members(container))
    assert processes.use(registry) == []
    assert registry.read_text() == "{}"


def test_the_next_stack_reaps_what_escaped(tmp_path):
    """If the launcher itself is killed outright, its command dies with it, but the command's
    own children are orphans in the group: the next stack kills them, by group and start time."""
    registry = tmp_path / "processes.json"
    stack = subprocess.Popen(
        [sys.executable, "-c", STACK, str(registry)], stdout=subprocess.PIPE, text=True
    )
    container = int(stack.stdout.readline())
    assert wait_for(lambda: len(members(container)) == 3)  # launcher, command, its worker
    os.kill(container, signal.SIGKILL)
    stack.kill()
    stack.wait()
    assert wait_for(lambda: len(members(container)) == 1)
    survivors = members(container)
    killed = processes.use(registry)
    assert killed == survivors
    assert wait_for(lambda: not members(container))
    assert registry.read_text() == "{}"


def test_reaping_leaves_unrecorded_and_newer_processes_alone(tmp_path):
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        registry = processes.Registry(tmp_path / "processes.json")
        registry.add(other.pid)
        registry._write({str(other.pid): processes.start_time(other.pid) + 1})  # an older group
        assert registry.reap() == []  # started before the recorded leader: not its group
        assert processes.alive(other.pid)
    finally:
        other.kill()
        other.wait()
    assert os.path.exists(tmp_path / "processes.json")
