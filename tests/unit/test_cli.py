"""The command lines' conventions: help, version, exit codes, log levels; and the direction of
imports between the three packages (the image's `sluice` knows nothing of the others)."""

import json
import subprocess
import sys

import pytest

from sluice.cli import build_parser
from sluice.errors import ExitCode
from sluice_local.cli import build_parser as build_local_parser


def commands(parser) -> list[str]:
    return sorted(parser._subparsers._group_actions[0].choices)


COMMANDS = commands(build_parser())
LOCAL_COMMANDS = commands(build_local_parser())


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120
    )


def test_the_image_has_exactly_what_sagemaker_runs():
    assert COMMANDS == ["evaluate", "export", "monitor", "serve", "train"]
    assert {"up", "demo", "transform", "quickstart"} <= set(LOCAL_COMMANDS)


@pytest.mark.parametrize(
    "module,command",
    [("sluice.cli", c) for c in [None, *COMMANDS]]
    + [("sluice_local.cli", c) for c in [None, *LOCAL_COMMANDS]],
)
def test_every_command_has_help(module, command):
    proc = run(module, *([command] if command else []), "--help")
    assert proc.returncode == 0, proc.stderr
    prog = "sluice-local" if module == "sluice_local.cli" else "sluice"
    assert f"usage: {prog}" in proc.stdout


@pytest.mark.parametrize("module", ["sluice.cli", "sluice_local.cli"])
def test_version_and_documented_exit_codes(module):
    from sluice import __version__

    assert run(module, "--version").stdout.split()[-1] == __version__
    top = run(module, "--help").stdout
    for code in ExitCode:
        assert f"  {code.value:<4} " in top
    assert len({c.value for c in ExitCode}) == len(ExitCode)  # distinct


def test_usage_errors_exit_2_and_bad_input_exits_1(tmp_path):
    assert run("sluice.cli", "--log-level", "LOUD", "train").returncode == ExitCode.USAGE
    assert run("sluice.cli", "no-such-command").returncode == ExitCode.USAGE
    missing = run("sluice.cli", "evaluate", str(tmp_path), "--data", str(tmp_path / "none"))
    assert missing.returncode == ExitCode.FAILED, missing.stdout + missing.stderr
    assert "Traceback" not in missing.stdout + missing.stderr


def test_log_level_is_case_insensitive_and_applies(tmp_path):
    proc = run("sluice.cli", "--log-level", "error", "monitor", "run")
    assert proc.returncode == ExitCode.FAILED  # run needs --data ...
    assert "needs --data" in proc.stdout  # an ERROR line still shows at level ERROR


def test_train_help_lists_every_hyperparameter():
    from sluice.hyperparameters import TrainConfig

    out = run("sluice.cli", "train", "--help").stdout
    for name in TrainConfig.field_docs():
        assert f"  {name} " in out


def imported_by(package: str) -> set[str]:
    """Top-level modules loaded once every module of `package` is imported, in a fresh process."""
    code = (
        f"import importlib, json, pkgutil, sys, {package}\n"
        f"for m in pkgutil.iter_modules({package}.__path__):\n"
        f"    importlib.import_module('{package}.' + m.name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {m.split(".")[0] for m in json.loads(proc.stdout.splitlines()[-1])}


def test_the_container_package_imports_nothing_of_the_emulator_or_the_functions():
    """Every module of `sluice` imported (as the image does, and more): none of the
    developer-only packages comes along, even though they are installed here."""
    dev_only = {
        "moto",
        "samtranslator",
        "aws_lambda_powertools",
        "sluice_local",
        "sluice_functions",
    }
    assert not imported_by("sluice") & dev_only


def test_the_functions_package_never_imports_torch_or_the_other_parts():
    assert not imported_by("sluice_functions") & {"torch", "transformers", "sluice", "sluice_local"}
