"""CUDA forward compatibility: on only where the host's driver is older than the image's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sluice import cuda_compat as cc


def test_driver_versions_are_read_from_the_kernel_module_files(tmp_path):
    sysfs = tmp_path / "version"
    sysfs.write_text("535.183.01\n")
    proc = tmp_path / "proc-version"
    proc.write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:56:02 UTC 2025\n"
    )
    assert cc.host_driver((sysfs, proc)) == (535, 183, 1)
    assert cc.host_driver((tmp_path / "missing", proc)) == (580, 95, 5)
    assert cc.host_driver((tmp_path / "missing",)) is None


def test_the_compat_version_is_the_libcuda_in_the_compat_folder(tmp_path):
    (tmp_path / "libcuda.so.1").touch()
    (tmp_path / "libcuda.so.580.65.06").touch()
    (tmp_path / "libnvidia-ptxjitcompiler.so.580.65.06").touch()
    assert cc.compat_driver(tmp_path) == (580, 65, 6)
    assert cc.compat_driver(tmp_path / "none") is None


def test_only_an_older_host_driver_gets_the_compat_libraries():
    compat = (580, 65, 6)
    assert cc.needed((535, 183, 1), compat)  # Batch Transform's al2-ami-sagemaker-batch-gpu-535
    assert not cc.needed((580, 95, 5), compat)  # a newer driver is used as it is
    assert not cc.needed(None, compat)  # a CPU host
    assert not cc.needed((535, 183, 1), None)  # an image without the package
    assert cc.library_path("/usr/lib") == f"{cc.COMPAT_DIR}{os.pathsep}/usr/lib"
    assert cc.library_path("") == str(cc.COMPAT_DIR)


def test_sluice_reexecutes_itself_once_with_the_compat_libraries(tmp_path):
    """`sluice` on a host driver older than the image's compat package: the command re-executes
    as `python -m sluice ...` with the compat folder first on the library path (os.execve stands
    in, printing what it was given); the re-executed process does not go round again."""
    compat = tmp_path / "compat"
    compat.mkdir()
    (compat / "libcuda.so.580.65.06").touch()
    driver = tmp_path / "version"
    driver.write_text("535.183.01\n")
    code = (
        "import json, os, sys, pathlib\n"
        "from sluice import cuda_compat as cc, cli\n"
        f"cc.COMPAT_DIR = pathlib.Path({str(compat)!r})\n"
        f"cc.DRIVER_FILES = (pathlib.Path({str(driver)!r}),)\n"
        "def execve(path, args, env):\n"
        "    print(json.dumps({'args': args, 'env': env})); sys.exit(0)\n"
        "os.execve = execve\n"
        "sys.exit(cli.main(['train', '--help']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != cc.DONE}
    env["LD_LIBRARY_PATH"] = "/opt/lib"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["args"] == [sys.executable, "-m", "sluice", "train", "--help"]
    assert seen["env"]["LD_LIBRARY_PATH"] == f"{compat}{os.pathsep}/opt/lib"
    assert seen["env"][cc.DONE] == "driver 535.183.1 < 580.65.6"
    # the re-executed process: nothing to do
    again = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, cc.DONE: seen["env"][cc.DONE]},
    )
    assert again.returncode == 0 and "usage: sluice train" in again.stdout, again.stderr
