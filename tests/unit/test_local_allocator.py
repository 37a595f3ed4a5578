"""The local stack's allocator setting (local/sluice_local/allocator.py): glibc's arenas capped,
observed through glibc's own report of its heaps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sluice_local import allocator

# threads alive at once, each allocating from malloc (objects above pymalloc's 512 bytes); then
# glibc's malloc_info (one <heap> per arena) written to a file
CHILD = """
import ctypes, sys, threading
sys.path.insert(0, {local!r})
from sluice_local.allocator import limit_arenas
print(limit_arenas() if {limit} else False)
hold, go = [], threading.Barrier(8)
def work():
    go.wait()
    hold.append([bytes(4096 + i) for i in range(200)])
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
fp = libc.fopen({path!r}.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(fp))
libc.fclose(ctypes.c_void_p(fp))
"""


def heaps(tmp_path, limit: bool, env: dict | None = None) -> tuple[str, int]:
    path = tmp_path / f"malloc-{limit}.xml"
    local = str(Path(allocator.__file__).parents[1])
    code = CHILD.format(local=local, limit=limit, path=str(path))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    return out, path.read_text().count("<heap nr=")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_the_stack_caps_glibcs_arenas(tmp_path):
    env = {"PATH": "/usr/bin:/bin"}
    set_, capped = heaps(tmp_path, limit=True, env=env)
    _, default = heaps(tmp_path, limit=False, env=env)
    assert set_ == "True"
    assert capped <= allocator.ARENAS < default


def test_a_malloc_arena_max_in_the_environment_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert allocator.limit_arenas() is False
