import subprocess
import sys

import pytest

from sluice.cli import build_parser

COMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)


def test_the_commands_the_container_needs_exist():
    assert {"train", "evaluate", "export", "demo"} <= set(COMMANDS)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_command_has_help(command):
    args = [sys.executable, "-m", "sluice.cli", *([command] if command else []), "--help"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "usage: sluice" in proc.stdout


def test_train_help_lists_every_hyperparameter():
    from sluice.hyperparameters import TrainConfig

    out = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "train", "--help"], capture_output=True, text=True
    ).stdout
    for name in TrainConfig.field_docs():
        assert f"  {name} " in out
