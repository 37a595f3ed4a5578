"""tcmalloc under `serve` on CPU hosts, as vLLM's CPU installation guide asks.

vLLM's CPU backend warns at start when tcmalloc is not in LD_PRELOAD: glibc's allocator returns
and re-requests memory around every step's many short-lived tensors. Measured (docs/benchmarks.md,
records that share a prefix, 2 CPU cores): 1.26x the records/s of glibc's allocator.
LD_PRELOAD is read when a process starts, so `serve` re-executes itself once with the library
first, and vLLM's engine process inherits it. Only where it can matter and do no harm: a host
without an NVIDIA driver, a tcmalloc found in the system's library folders (`apt-get install
libtcmalloc-minimal4`), and `SLUICE_MALLOC` not `system` (the switch back to glibc's allocator).
The GPU image installs none, so nothing changes there.
"""

from __future__ import annotations

import os
from pathlib import Path

from .cuda_compat import host_driver, reexec
from .errors import SluiceError

DONE = "SLUICE_MALLOC_PRELOADED"  # set in the re-executed process (to the library's path)
LIBRARIES = ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")
LIB_DIRS = (
    Path("/usr/lib/x86_64-linux-gnu"),
    Path("/usr/lib/aarch64-linux-gnu"),
    Path("/usr/lib64"),
    Path("/usr/lib"),
)


def find_tcmalloc(dirs: tuple[Path, ...] = LIB_DIRS) -> Path | None:
    """The first tcmalloc shared library in the system's library folders, or None."""
    for d in dirs:
        for name in LIBRARIES:
            if (d / name).is_file():
                return d / name
    return None


def preload_env(env: dict[str, str], lib: Path | None, gpu_host: bool) -> dict[str, str] | None:
    """The environment to re-execute `serve` with, or None to run as it is."""
    choice = env.get("SLUICE_MALLOC", "auto")
    if choice not in ("auto", "system"):
        raise SluiceError(f"SLUICE_MALLOC must be auto or system, not {choice!r}")
    if choice == "system" or gpu_host or lib is None or env.get(DONE):
        return None
    if "tcmalloc" in env.get("LD_PRELOAD", ""):  # the operator preloaded one already
        return None
    preload = " ".join(p for p in (str(lib), env.get("LD_PRELOAD", "")) if p)
    return {**env, "LD_PRELOAD": preload, DONE: str(lib)}


def reexec_serve(argv: list[str]) -> None:
    """Re-execute the `sluice serve` command line `argv` once with tcmalloc preloaded (see the
    module's docstring); returns where it does not apply."""
    env = preload_env(dict(os.environ), find_tcmalloc(), host_driver() is not None)
    if env is not None:
        reexec(argv, env)
