"""`serve` preloads tcmalloc on CPU hosts (vLLM's CPU guide), and only there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.errors import SluiceError
from sluice.malloc import DONE, find_tcmalloc, preload_env

LIB = "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"


def test_a_cpu_host_with_tcmalloc_preloads_it_first_once():
    env = preload_env({"LD_PRELOAD": "/opt/other.so", "PATH": "/bin"}, Path(LIB), gpu_host=False)
    assert env == {"LD_PRELOAD": f"{LIB} /opt/other.so", "PATH": "/bin", DONE: LIB}
    assert preload_env(env, Path(LIB), gpu_host=False) is None  # the re-executed process


@pytest.mark.parametrize(
    "env, lib, gpu_host",
    [
        ({"SLUICE_MALLOC": "system"}, LIB, False),  # the operator's switch back to glibc's
        ({}, LIB, True),  # a GPU host: the image installs none, and nothing changes there
        ({}, None, False),  # not installed
        ({"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"}, LIB, False),  # preloaded already
    ],
)
def test_no_preload_where_it_cannot_help_or_is_declined(env, lib, gpu_host):
    assert preload_env(env, lib and Path(lib), gpu_host) is None


def test_an_unknown_choice_is_refused():
    with pytest.raises(SluiceError, match="SLUICE_MALLOC must be auto or system, not 'jemalloc'"):
        preload_env({"SLUICE_MALLOC": "jemalloc"}, None, gpu_host=False)


def test_the_minimal_library_is_found_first(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "libtcmalloc.so.4").touch()
    assert find_tcmalloc((tmp_path / "a", tmp_path / "b")) == tmp_path / "b" / "libtcmalloc.so.4"
    (tmp_path / "b" / "libtcmalloc_minimal.so.4").touch()
    assert find_tcmalloc((tmp_path / "b",)) == tmp_path / "b" / "libtcmalloc_minimal.so.4"
    assert find_tcmalloc((tmp_path / "a",)) is None


def test_serve_reexecutes_itself_with_tcmalloc_whatever_options_come_first(tmp_path):
    """`sluice --log-level DEBUG serve ...` is serve too: the parsed command decides, not the
    first word (os.execve stands in, printing what it was given)."""
    lib = tmp_path / "libtcmalloc_minimal.so.4"
    lib.touch()
    code = (
        "import json, os, sys, pathlib\n"
        "from sluice import cli, cuda_compat, malloc\n"
        f"malloc.find_tcmalloc = lambda: pathlib.Path({str(lib)!r})\n"
        "malloc.host_driver = lambda: None\n"
        "def execve(path, args, env):\n"
        "    print(json.dumps({'args': args, 'env': env})); sys.exit(0)\n"
        "os.execve = execve\n"
        "sys.exit(cli.main(['--log-level', 'DEBUG', 'serve', '--model-dir', '/nowhere']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (DONE, "LD_PRELOAD", "SLUICE_MALLOC")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["args"][1:] == [
        "-m",
        "sluice",
        "--log-level",
        "DEBUG",
        "serve",
        "--model-dir",
        "/nowhere",
    ]
    assert seen["env"]["LD_PRELOAD"] == str(lib) and seen["env"][DONE] == str(lib)
