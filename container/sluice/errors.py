"""User-facing errors: one actionable line for the log and SageMaker's failure file."""

from __future__ import annotations

import sys
from enum import IntEnum
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


class ExitCode(IntEnum):
    """What each `sluice` command's exit status means (listed in `sluice --help`)."""

    OK = 0
    FAILED = 1  # bad input, bad configuration or a failed job: one line says why
    USAGE = 2  # the command line itself is wrong (argparse's convention)
    INTERNAL = 3  # a bug in Sluice: a traceback follows, please report it
    DRIFT = 4  # `sluice monitor run --fail-on-violations` found violations
    CTRL_C = 130  # 128 + SIGINT
    INTERRUPTED = 143  # 128 + SIGTERM (StopTrainingJob, spot): stopped cleanly, checkpoint kept

    @classmethod
    def help(cls) -> str:
        text = {
            cls.OK: "success",
            cls.FAILED: "failed: bad input or configuration (one line says why)",
            cls.USAGE: "usage error (bad command line)",
            cls.INTERNAL: "internal error (a bug: traceback on stderr)",
            cls.DRIFT: "drift found (monitor run --fail-on-violations)",
            cls.CTRL_C: "interrupted by Ctrl-C",
            cls.INTERRUPTED: "stopped by SIGTERM (training: checkpoint written, resumes)",
        }
        return "exit codes:\n" + "\n".join(f"  {c.value:<4} {text[c]}" for c in cls)
