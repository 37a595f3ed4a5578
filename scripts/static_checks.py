"""Sluice's static checks, as CI runs them: each check runs, each failure fails the whole run.

    python scripts/static_checks.py [--root DIR] [--only ruff,asl,...] [--sam PATH] [--checkov PATH]

Checks: ruff (lint and format), cfn-lint, `sam validate --lint`, every statemachine/*.asl.yaml or
.asl.json (valid YAML/JSON as written, then rendered as CloudFormation renders it: substitutions
from template.yaml, YAML to JSON) by statelint and by moto's ASL parser, and checkov with the skip
list committed in .checkov.yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FAKE_ACCOUNT = "123456789012"
FUNCTION_ZIP_BUDGET = 5 * 2**20  # Lambda packages stay light: cold starts matter


def zipped_size(folder: Path) -> int:
    """Size of the deployment zip sam would upload for one built function."""
    import zipfile

    with tempfile.TemporaryFile() as f:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
            for p in sorted(folder.rglob("*")):
                if p.is_file():
                    z.write(p, p.relative_to(folder))
        return f.tell()


class MissingTool(Exception):
    """A tool a check needs is not installed; the message says how to get it."""


def find_tool(name: str, explicit: str | None, how: str) -> str:
    """Resolve a tool from an explicit path, the running venv, or PATH."""
    candidates = [explicit] if explicit else []
    candidates += [str(Path(sys.executable).parent / name), shutil.which(name)]
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise MissingTool(f"`{name}` not found. {how}")


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> int:
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}).returncode


# --- ASL ---------------------------------------------------------------------------------------


def load_template(path: Path) -> dict:
    """Parse a CloudFormation/SAM template with its short-form tags (!Ref, !Sub, ...)."""
    from sluice_local.template import load_template as load

    return load(path)


def placeholder_resolver(template: dict):
    """The local stack's intrinsic-function resolver on the parameters' defaults, with stand-ins
    for what only a deployment knows (ARNs, names): each substitution gets a value of its type."""
    from sluice_local.template import Resolver, Unresolved, parameter_values

    class Placeholders(Resolver):
        def ref(self, name: str) -> object:
            try:
                return super().ref(name)
            except Unresolved:
                return f"placeholder-{name}"

        def getatt(self, resource: str, attr: str) -> object:
            try:
                return super().getatt(resource, attr)
            except Unresolved:
                if attr.endswith("Arn"):
                    return f"arn:aws:iam::{FAKE_ACCOUNT}:role/placeholder-{resource}"
                return f"placeholder-{resource}"

    # a parameter without a default (ImageUri) gets a stand-in of its type
    stand_ins = {
        name: str(spec.get("MinValue", 1))
        if spec.get("Type") == "Number"
        else f"placeholder-{name}"
        for name, spec in (template.get("Parameters") or {}).items()
        if "Default" not in spec
    }
    return Placeholders(parameter_values(template, stand_ins), template.get("Conditions") or {})


def state_machines(template: dict, root: Path) -> dict[Path, dict]:
    """Map each ASL file the template references to the substitutions it gets."""
    resolver = placeholder_resolver(template)
    found: dict[Path, dict] = {}
    for res in (template.get("Resources") or {}).values():
        if res.get("Type") not in (
            "AWS::Serverless::StateMachine",
            "AWS::StepFunctions::StateMachine",
        ):
            continue
        props = res.get("Properties", {}) or {}
        uri = props.get("DefinitionUri")
        if isinstance(uri, str):
            subs = props.get("DefinitionSubstitutions", {}) or {}
            found[(root / uri).resolve()] = {k: resolver.resolve(v) for k, v in subs.items()}
    return found


def render(text: str, subs: dict) -> tuple[str, list[str]]:
    """The JSON definition CloudFormation hands Step Functions; and any undefined names."""
    from sluice_local.template import render_definition

    return render_definition(text, subs)


def filter_false_positive(line: str, text: str) -> bool:
    """statelint rejects JSONPath filter expressions (`$.a[?(@.b=='c')].d`) that Step Functions
    accepts in Paths; exempt exactly the fields whose value is one."""
    m = re.search(r'Field "([^"]+)" of \w+ at "[^"]*\.([^".]+)" is not a JSONPath', line)
    if not m:
        return False
    field, state = m.groups()
    pattern = rf'"{re.escape(field)}": "[^"]*\[\?\('
    states = json.loads(text).get("States", {})
    return _state_has(states, state, pattern)


def _state_has(states: dict, name: str, pattern: str) -> bool:
    for key, st in states.items():
        if key == name and re.search(pattern, json.dumps(st)):
            return True
        for branch in [
            *st.get("Branches", []),
            st.get("ItemProcessor") or st.get("Iterator") or {},
        ]:
            if _state_has(branch.get("States", {}), name, pattern):
                return True
    return False


def check_asl_file(path: Path, subs: dict, statelint: str) -> list[str]:
    """Validate one definition; return the problems found (empty when valid)."""
    import yaml

    problems: list[str] = []
    source = path.read_text()
    try:  # editors, linters and jq read the file as written
        yaml.safe_load(source)
    except yaml.YAMLError as e:
        problems.append(f"not valid YAML/JSON before substitution: {e}")
    try:
        text, missing = render(source, subs)
        json.loads(text)
    except (ValueError, yaml.YAMLError) as e:
        return [*problems, f"not a valid definition after substitution: {e}"]
    for name in sorted(set(missing)):
        problems.append(f"${{{name}}} is not defined in the template's DefinitionSubstitutions")
    with tempfile.NamedTemporaryFile("w", suffix=".asl.json", delete=False) as f:
        f.write(text)
    try:
        out = subprocess.run([statelint, f.name], capture_output=True, text=True)
        if out.returncode != 0:
            lines = [x for x in (out.stdout + out.stderr).splitlines() if x.strip()]
            real = [x for x in lines if not filter_false_positive(x, text)]
            # statelint's summary line ("N errors:") counts the exempted ones too
            if any(not re.match(r"^\d+ errors?:$", x.strip()) for x in real):
                problems += [f"statelint: {line}" for line in real]
    finally:
        os.unlink(f.name)
    try:
        from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

        from sluice_local import moto_fixes

        moto_fixes.apply()  # the interpreter the local stack runs (optimized SageMaker, .sync)
        AmazonStateLanguageParser.parse(text)
    except Exception as e:  # the parser raises a variety of types; any is a refusal
        problems.append(f"moto ASL parser: {type(e).__name__}: {e}")
    return problems


def check_asl(root: Path, statelint: str) -> int:
    files = sorted(
        p for p in (root / "statemachine").glob("*.asl.*") if p.suffix in (".json", ".yaml")
    )
    template = root / "template.yaml"
    subs_by_file = state_machines(load_template(template), root) if template.exists() else {}
    failed = 0
    for path in files:
        subs = subs_by_file.get(path.resolve())
        if subs is None:
            print(f"note: {path.name} is not referenced by template.yaml; checked as is")
        problems = check_asl_file(path, subs or {}, statelint)
        status = "ok" if not problems else "FAILED"
        print(f"{path.relative_to(root)}: {status}")
        for p in problems:
            print(f"  {p}")
        failed += bool(problems)
    print(f"{len(files)} definition(s) checked, {failed} failed")
    return 1 if failed else 0


# --- the checks ----------------------------------------------------------------------------------


def make_checks(args: argparse.Namespace) -> dict[str, Callable[[], int]]:
    root: Path = args.root
    venv_hint = "Run `make setup` (creates .venv with the pinned dev tools)."

    def ruff_check() -> int:
        return run([find_tool("ruff", None, venv_hint), "check", "."], root)

    def ruff_format() -> int:
        return run([find_tool("ruff", None, venv_hint), "format", "--check", "."], root)

    def cfn_lint() -> int:
        return run([find_tool("cfn-lint", None, venv_hint), "template.yaml"], root)

    def sam_validate() -> int:
        sam = find_tool(
            "sam", args.sam, "Run `make lint` (creates .venv-sam) or pip install aws-sam-cli."
        )
        cmd = [sam, "validate", "--lint", "--region", "us-east-1", "--template", "template.yaml"]
        return run(cmd, root, {"SAM_CLI_TELEMETRY": "0"})

    def sam_build() -> int:
        """`sam build` must work here, and each function's zip stays within its budget."""
        sam = find_tool(
            "sam", args.sam, "Run `make lint` (creates .venv-sam) or pip install aws-sam-cli."
        )
        with tempfile.TemporaryDirectory() as build:
            cmd = [
                sam,
                "build",
                "--region",
                "us-east-1",
                "--build-dir",
                build,
                "--template",
                "template.yaml",
            ]
            rc = run(cmd, root, {"SAM_CLI_TELEMETRY": "0"})
            if rc:
                return rc
            for fn in sorted(p for p in Path(build).iterdir() if p.is_dir()):
                size = zipped_size(fn)
                ok = size <= FUNCTION_ZIP_BUDGET
                print(f"{fn.name}: {size / 2**20:.2f} MB zipped ({'ok' if ok else 'OVER BUDGET'})")
                rc |= not ok
        return int(rc)

    def asl() -> int:
        return check_asl(root, find_tool("statelint", None, venv_hint))

    def checkov() -> int:
        tool = find_tool(
            "checkov",
            args.checkov,
            "Run `make lint` (creates .venv-checkov) or pip install checkov.",
        )
        cmd = [tool, "-f", "template.yaml", "--framework", "cloudformation", "--skip-download"]
        cmd += ["--config-file", ".checkov.yaml", "--compact", "--quiet"]
        return run(cmd, root)

    return {
        "ruff": ruff_check,
        "ruff-format": ruff_format,
        "cfn-lint": cfn_lint,
        "sam-validate": sam_validate,
        "sam-build": sam_build,
        "asl": asl,
        "checkov": checkov,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=REPO, help="repository root to check")
    parser.add_argument("--only", default="", help="comma-separated subset of checks")
    parser.add_argument("--sam", help="path to the sam executable")
    parser.add_argument("--checkov", help="path to the checkov executable")
    args = parser.parse_args(argv)
    args.root = args.root.resolve()
    checks = make_checks(args)
    selected = [c for c in args.only.split(",") if c] or list(checks)
    unknown = set(selected) - set(checks)
    if unknown:
        parser.error(f"unknown check(s) {sorted(unknown)}; choose from {list(checks)}")
    results: dict[str, str] = {}
    for name in selected:
        print(f"\n=== {name} ===", flush=True)
        try:
            results[name] = "ok" if checks[name]() == 0 else "FAILED"
        except MissingTool as e:
            print(f"error: {e}")
            results[name] = "MISSING TOOL"
    print("\n=== static checks ===")
    for name, status in results.items():
        print(f"{name:14} {status}")
    return 0 if all(s == "ok" for s in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
