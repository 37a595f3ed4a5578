"""CI's static checks fail on purpose: lint errors, invalid template properties, dangling Nexts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHECKS = REPO / "scripts" / "static_checks.py"

TEMPLATE = """\
AWSTemplateFormatVersion: "2010-09-09"
Transform: AWS::Serverless-2016-10-31
Parameters:
  PollSeconds:
    Type: Number
    Default: 30
Resources:
  Role:
    Type: AWS::IAM::Role
    Properties:
      AssumeRolePolicyDocument:
        Version: "2012-10-17"
        Statement:
          - Effect: Allow
            Principal: {Service: states.amazonaws.com}
            Action: sts:AssumeRole
  Machine:
    Type: AWS::Serverless::StateMachine
    Properties:
      DefinitionUri: statemachine/flow.asl.yaml
      Role: !GetAtt Role.Arn
      DefinitionSubstitutions:
        TopicArn: !Ref AWS::NoValue
        JobPrefix: sluice
        PollSeconds: !Ref PollSeconds
"""


def asl(next_state: str = "Done", extra: str = "") -> dict:
    return {
        "StartAt": "Start",
        "States": {
            "Start": {
                "Type": "Pass",
                "Parameters": {"Job": "${JobPrefix}-job", "Topic": "${TopicArn}" + extra},
                "Next": "Wait",
            },
            "Wait": {"Type": "Wait", "Seconds": "${PollSeconds}", "Next": next_state},
            "Done": {"Type": "Succeed"},
        },
    }


def project(tmp_path: Path, definition: dict, template: str = TEMPLATE) -> Path:
    """The definition as YAML, `${PollSeconds}` bare (a number once substituted)."""
    (tmp_path / "statemachine").mkdir()
    text = yaml.safe_dump(definition, sort_keys=False).replace("'${PollSeconds}'", "${PollSeconds}")
    assert "Seconds: ${PollSeconds}" in text
    (tmp_path / "statemachine" / "flow.asl.yaml").write_text(text)
    (tmp_path / "template.yaml").write_text(template)
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def checks(root: Path, only: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECKS), "--root", str(root), "--only", only],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_valid_definition_with_substitutions_passes(tmp_path):
    proc = checks(project(tmp_path, asl()), "asl,cfn-lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "statemachine/flow.asl.yaml: ok" in proc.stdout


def test_a_definition_that_is_not_json_or_yaml_until_substituted_fails(tmp_path):
    """Editors, linters and jq read the file as written: bare substitutions only where YAML
    allows them (a JSON file with `"Seconds": ${PollSeconds}` is neither)."""
    root = project(tmp_path, asl())
    text = json.dumps(asl(), indent=2).replace('"${PollSeconds}"', "${PollSeconds}")
    (root / "statemachine" / "flow.asl.yaml").write_text(text)
    proc = checks(root, "asl")
    assert proc.returncode == 1
    assert "not valid YAML/JSON before substitution" in proc.stdout


def test_dangling_next_fails(tmp_path):
    proc = checks(project(tmp_path, asl(next_state="Nowhere")), "asl")
    assert proc.returncode == 1
    assert "statemachine/flow.asl.yaml: FAILED" in proc.stdout
    assert "Nowhere" in proc.stdout


def test_undefined_substitution_fails(tmp_path):
    proc = checks(project(tmp_path, asl(extra="${Missing}")), "asl")
    assert proc.returncode == 1
    assert "${Missing} is not defined" in proc.stdout


def test_moto_parser_refusal_fails(tmp_path):
    definition = asl()
    definition["States"]["Start"]["Type"] = "Teleport"
    proc = checks(project(tmp_path, definition), "asl")
    assert proc.returncode == 1
    assert "moto ASL parser" in proc.stdout or "statelint" in proc.stdout


def test_invalid_template_property_fails_cfn_lint(tmp_path):
    bad = TEMPLATE.replace("DefinitionUri:", "DefinitionUrl:")
    proc = checks(project(tmp_path, asl(), template=bad), "cfn-lint")
    assert proc.returncode == 1
    assert "DefinitionUrl" in proc.stdout


def test_lint_error_fails_ruff(tmp_path):
    root = project(tmp_path, asl())
    (root / "bad.py").write_text("import os\n")  # unused import: F401
    proc = checks(root, "ruff")
    assert proc.returncode == 1
    assert "F401" in proc.stdout
    (root / "bad.py").write_text("x = {'a':1}\n")  # lint-clean, badly formatted
    assert checks(root, "ruff").returncode == 0
    assert checks(root, "ruff-format").returncode == 1


def test_missing_tool_is_named_with_how_to_get_it(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(CHECKS),
            "--root",
            str(project(tmp_path, asl())),
            "--only",
            "checkov",
            "--checkov",
            str(tmp_path / "nope"),
        ],
        capture_output=True,
        text=True,
        env={"PATH": "/nonexistent"},
    )
    if shutil.which("checkov", path=str(Path(sys.executable).parent)):
        pytest.skip("checkov is installed in this venv; the lookup would find it")
    assert proc.returncode == 1
    assert "`checkov` not found" in proc.stdout and "make lint" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
