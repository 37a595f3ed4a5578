"""Local Sluice survives `kill -9`: a burst of uploads, the stack killed at three points of the
flow (after the uploads were acknowledged, during the transform job, while the job's report is
written), started again each time: every upload ends with its output and one report, none is
transformed twice, and no process outlives a killed stack.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers import FIGURES, LocalUp

pytestmark = pytest.mark.slow

UPLOADS = 12
LINES = 3
OVERRIDES = ["BatchingWindowSeconds=5"]


def descendants(pid: int) -> dict[int, str]:
    """Every process below `pid` (pid -> its start time), from /proc."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
        starts[int(entry.name)] = fields[19]
    out, todo = {}, [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out[child] = starts[child]
            todo.append(child)
    return out


def alive(procs: dict[int, str]) -> list[int]:
    left = []
    for pid, start in procs.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == start and fields[0] != "Z":
            left.append(pid)
    return left


def crashed(stack: LocalUp, timeout_s: float) -> dict[int, str]:
    """Wait for the stack to kill itself at its failpoint; returns every process it had."""
    seen: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    while stack.proc.poll() is None:
        assert time.monotonic() < deadline, f"the stack did not crash: {stack.tail()}"
        seen.update(descendants(stack.proc.pid))
        time.sleep(0.2)
    assert stack.proc.returncode == -9, stack.tail()
    stack.log.close()
    return seen


def no_orphans(procs: dict[int, str]) -> None:
    deadline = time.monotonic() + 15
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(procs), f"processes outlived the stack: {alive(procs)}"


def test_kill_9_at_each_point_of_the_flow_loses_and_repeats_nothing(tmp_path, trained):
    state = tmp_path / "state"
    state.mkdir()
    stack = LocalUp(state, OVERRIDES).start()
    stack.users.use_model(trained["model"], "sluice-crash-model")
    users = stack.users
    keys = [f"incoming/crash/file-{i:02d}.txt" for i in range(UPLOADS)]
    with ThreadPoolExecutor(8) as pool:  # a burst: all acknowledged within a second
        list(
            pool.map(
                lambda k: users.put(k, [f"{k} line {j} the cat sat on" for j in range(LINES)]),
                keys,
            )
        )
    # 1. every upload acknowledged, the batching window still open: kill -9
    procs = descendants(stack.proc.pid)
    stack.proc.kill()
    stack.proc.wait()
    stack.log.close()
    no_orphans(procs)
    points = ["after the uploads were acknowledged"]

    # 2. during the transform job (its container starting or transforming)
    stack.start(
        SLUICE_LOCAL_CRASH_AT=r"job +TransformJob \S+ InProgress", SLUICE_LOCAL_CRASH_AFTER_S="15"
    )
    no_orphans(crashed(stack, 600))
    points.append("during the transform job")

    # 3. the job completed, its report not yet written (its event in flight)
    stack.start(SLUICE_LOCAL_CRASH_AT=r"job +TransformJob \S+ Completed")
    no_orphans(crashed(stack, 600))
    points.append("while the report is written")

    users = stack.start().users  # a new port: new clients
    try:
        reports = users.wait_for_reports(keys)
        uri = {k: f"s3://{users.bucket}/{k}" for k in keys}
        listed = [i for doc in reports.values() for i in doc.get("inputs", [])]
        assert all(k.endswith("_SUCCESS.json") for k in reports), reports
        duplicated = [k for k in keys if listed.count(uri[k]) > 1]
        lost = [k for k in keys if uri[k] not in listed]
        assert not duplicated and not lost, (duplicated, lost)
        outputs = {f["input"]: f for doc in reports.values() for f in doc["outputs"]}
        for k in keys:
            assert outputs[uri[k]]["records"] == LINES, outputs[uri[k]]
            assert outputs[uri[k]]["error_lines"] == 0, outputs[uri[k]]
        # one job for the burst, never a second one for the same uploads
        sm = stack.client("sagemaker")
        jobs = sm.list_transform_jobs()["TransformJobSummaries"]
        assert [j["TransformJobStatus"] for j in jobs] == ["Completed"], jobs
        events = stack.events()
        assert "delivering again what the last run accepted" in events
    finally:
        procs = descendants(stack.proc.pid)
        assert stack.stop() == 0
        no_orphans(procs)
    assert not list((state / "outbox").glob("*.json")), "work left undone in the outbox"
    FIGURES.append(
        f"local crash test: {len(points)} kill -9 points x {UPLOADS} uploads "
        f"({'; '.join(points)}): lost {len(lost)}, duplicated {len(duplicated)}, "
        f"transform jobs {len(jobs)}"
    )
