"""The suite's own scheduling: under `make test` (pytest-xdist, --dist loadgroup) a module's tests
run on one worker and share its module fixtures, and modules that name one `xdist_group` share a
worker. When that silently stops (pytest 9.2 with xdist 3.8 did: pytest-dev/pytest-xdist#1386),
every module fixture (a local stack, a vLLM server) starts once per worker, and CI pays minutes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# each test writes down where it ran and under which node id
TEST = """
import json, os
{mark}

def _seen(request):
    row = [__name__, os.environ.get("PYTEST_XDIST_WORKER"), request.node.nodeid]
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps(row) + "\\n")

""" + "".join(f"def test_{i}(request):\n    _seen(request)\n\n" for i in range(6))


def test_make_tests_workers_keep_a_module_and_a_named_group_together(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    # the repository's conftest, whose hook gives every module its own group
    (suite / "conftest.py").write_text('pytest_plugins = ["tests.conftest"]\n')
    marks = {
        "test_alone_a": "",
        "test_alone_b": "",
        "test_shared_c": "import pytest\npytestmark = pytest.mark.xdist_group('shared')",
        "test_shared_d": "import pytest\npytestmark = pytest.mark.xdist_group('shared')",
    }
    for name, mark in marks.items():
        (suite / f"{name}.py").write_text(TEST.format(mark=mark))
    seen = tmp_path / "seen.jsonl"
    # the options `make test` passes (the Makefile's XDIST), on two workers
    xdist = re.search(r"-n \$\(TEST_WORKERS\) ([^)]*)\)", (REPO / "Makefile").read_text())
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", *xdist.group(1).split(), "-q", str(suite)],
        cwd=tmp_path,
        env={**os.environ, "SEEN": str(seen), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(x) for x in seen.read_text().splitlines()]
    assert len(rows) == 6 * len(marks)
    workers: dict[str, set] = defaultdict(set)
    for module, worker, nodeid in rows:
        group = "shared" if "shared" in module else module
        # xdist's loadgroup schedules by this suffix; without it tests are spread one by one
        assert nodeid.endswith(f"@{group}"), nodeid
        workers[group].add(worker)
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
