"""Test helpers: tiny hyperparameters, and a runner for the real `sluice` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Figures a test measured, printed at the end of the run (tests/conftest.py)
FIGURES: list[str] = []

# Small enough for 2 CPU cores, big enough that loss visibly falls.
TINY = {
    "model_size": "tiny",
    "vocab_size": "384",
    "n_positions": "64",
    "block_size": "32",
    "batch_size": "8",
    "learning_rate": "0.003",
    "warmup_steps": "5",
    "log_interval": "5",
    "checkpoint_interval": "0",
    "validation_fraction": "0.1",
    "edge_seq_len": "16",
    "export_edge": "false",
    "loss_curve": "false",
    "max_steps": "30",
}


def lambda_env(**extra: str) -> dict[str, str]:
    """What template.yaml gives every function (Globals), as the handler tests set it, with
    moto's credentials and region, plus each test's own variables."""
    return {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "POWERTOOLS_METRICS_NAMESPACE": "Sluice",
        "STAGE": "dev",
        "DATA_BUCKET": "sluice-dev-data",
        **extra,
    }


def hp(**overrides) -> dict[str, str]:
    """TINY hyperparameters with overrides, all as strings (as SageMaker passes them)."""
    return {**TINY, **{k: str(v) for k, v in overrides.items()}}


def sets(params: dict[str, str]) -> list[str]:
    return [a for k, v in params.items() for a in ("--set", f"{k}={v}")]


def run_sluice(
    *args: str,
    env: dict | None = None,
    timeout: int = 600,
    check: bool = True,
    module: str = "sluice.cli",
) -> subprocess.CompletedProcess:
    """Run the real `sluice` command (or another `module`'s) in a subprocess, capture its output."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{module} {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n"
            f"{proc.stderr[-4000:]}"
        )
    return proc


def run_local(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run the real `sluice-local` command (the emulator's side: transform, quickstart)."""
    return run_sluice(*args, module="sluice_local.cli", **kwargs)


def train_losses(stdout: str) -> list[float]:
    """train_loss values from the log, read with the documented MetricDefinitions regex."""
    import re

    from sluice.metrics import METRIC_DEFINITIONS

    rx = re.compile(next(d["Regex"] for d in METRIC_DEFINITIONS if d["Name"] == "train_loss"))
    return [float(m.group(1)) for m in rx.finditer(stdout)]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


@dataclass
class LambdaContext:
    """What Powertools reads from a Lambda context object."""

    function_name: str = "sluice-dev-function"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:sluice"
    aws_request_id: str = "req-1"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000
