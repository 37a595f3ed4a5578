"""CUDA forward compatibility: run the image's CUDA on a host whose NVIDIA driver is older.

The image's torch and vLLM are CUDA 13.0 builds (what vLLM's release on the package registry is
built against), which need driver 580 or newer. SageMaker's GPU hosts for Batch Transform run
driver 470 or 535 (TransformAmiVersion); endpoints can pick 580 (InferenceAmiVersion). NVIDIA's
`cuda-compat-13-0` package, in the image at /usr/local/cuda/compat, carries the user-mode driver
(libcuda) of 580 for data-center GPUs on older kernel drivers. SageMaker's guide ("Updating
inference containers to comply with the NVIDIA Container Toolkit") says a container must put it on
the library path itself, and only when the host's driver is older than the package's: a newer
host driver must be used as it is.

The library path is read when a process starts, so `sluice` re-executes itself once with it set.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

COMPAT_DIR = Path("/usr/local/cuda/compat")
DRIVER_FILES = (Path("/sys/module/nvidia/version"), Path("/proc/driver/nvidia/version"))
DONE = "SLUICE_CUDA_COMPAT"  # set in the re-executed process (to the decision taken)


def _version(text: str) -> tuple[int, ...] | None:
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(x) for x in m.groups() if x is not None) if m else None


def host_driver(files: tuple[Path, ...] | None = None) -> tuple[int, ...] | None:
    """The kernel driver's version (e.g. (535, 183, 1)); None on a host without one."""
    for f in DRIVER_FILES if files is None else files:
        try:
            found = _version(f.read_text())
        except OSError:
            continue
        if found:
            return found
    return None


def compat_driver(compat: Path | None = None) -> tuple[int, ...] | None:
    """The version of the forward-compatible libcuda in the image (libcuda.so.580.65.06)."""
    for lib in sorted((COMPAT_DIR if compat is None else compat).glob("libcuda.so.*")):
        found = _version(lib.name.removeprefix("libcuda.so."))
        if found and len(found) >= 2:
            return found
    return None


def needed(host: tuple[int, ...] | None, compat: tuple[int, ...] | None) -> bool:
    """Forward compatibility only for an older host driver (a newer one is used as it is)."""
    return host is not None and compat is not None and host < compat


def library_path(current: str, compat: Path | None = None) -> str:
    first = COMPAT_DIR if compat is None else compat
    return os.pathsep.join(p for p in (str(first), current) if p)


def reexec_if_needed(argv: list[str] | None = None) -> None:
    """Re-execute this command with the compat libraries first on the library path, once, when
    the host's driver is older than the image's CUDA needs. No-op everywhere else (CPU hosts,
    developer machines, a new enough driver)."""
    if os.environ.get(DONE):
        return
    host, compat = host_driver(), compat_driver()
    if not needed(host, compat):
        return
    env = dict(os.environ)
    env[DONE] = f"driver {'.'.join(map(str, host))} < {'.'.join(map(str, compat))}"
    env["LD_LIBRARY_PATH"] = library_path(env.get("LD_LIBRARY_PATH", ""))
    reexec(sys.argv[1:] if argv is None else argv, env)


def reexec(argv: list[str], env: dict[str, str]) -> None:
    """Replace this process with `python -m sluice <argv>` under `env` (same process id)."""
    os.execve(sys.executable, [sys.executable, "-m", "sluice", *argv], env)
