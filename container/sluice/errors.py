"""User-facing errors: one actionable line for the log and SageMaker's failure file."""

from __future__ import annotations

import sys
from pathlib import Path


class SluiceError(Exception):
    """A failure whose message is the whole story: bad input, bad configuration, missing data.

    Commands catch it at the top, write the message to the failure file and exit non-zero,
    instead of printing a traceback nobody can act on.
    """


def write_failure(path: Path, message: str) -> None:
    """Write the reason SageMaker shows as FailureReason (it keeps the first 1024 characters)."""
    line = " ".join(message.split())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line[:1024] + "\n")
    except OSError as e:  # never mask the real failure with a secondary one
        print(f"could not write failure file {path}: {e}", file=sys.stderr)
