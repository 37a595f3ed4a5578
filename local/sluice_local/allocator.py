"""The local stack's memory allocator: glibc's, with few arenas.

`sluice-local up` answers each request on a thread of its own, and the request that leads a
commit pickles the snapshot on that thread (local/sluice_local/durability.py). glibc gives
threads their own arenas (up to 8 per core) and keeps what is freed in each for reuse, so the
megabytes of snapshot pickles, made on a different thread each time, stay resident in many.
Measured (`python -m benchmarks.scale --uploads 10000`, 2 cores): the stack's anonymous memory
at the end of the upload burst 857 MB with glibc's default, 536 MB with two arenas.
"""

from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8  # glibc's <malloc.h>
ARENAS = 2


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's malloc arenas for this process (before its threads start); returns whether it
    was set. A MALLOC_ARENA_MAX in the environment (glibc reads it itself) wins; elsewhere than
    glibc (macOS, musl) nothing changes."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return mallopt(M_ARENA_MAX, arenas) == 1
