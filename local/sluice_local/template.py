"""template.yaml made deployable on this machine: parameters, the SAM transform, intrinsics.

Parameter values come from the template's defaults, then samconfig.toml's `[local]` environment
(as `sam deploy --config-env local` would read them), then explicit overrides, and are checked as
CloudFormation checks them. The transform is aws-sam-translator's, the library `sam deploy` runs;
local code and definition paths stand in for the S3 locations `sam package` would upload to.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import ACCOUNT, REGION

SUBSTITUTION = re.compile(r"\$\{([A-Za-z0-9_]+)\}")
LOCAL_BUCKET = "sluice-local-code"  # stands in for where `sam package` uploads code
NO_VALUE = object()  # Ref AWS::NoValue: the property is left out


class TemplateError(Exception):
    """The template or its parameters cannot be deployed; the message says why."""


def load_template(path: Path) -> dict:
    """Parse a CloudFormation/SAM template with its short-form tags (!Ref, !Sub, ...)."""
    from samtranslator.yaml_helper import yaml_parse

    return yaml_parse(path.read_text())


# --- parameters --------------------------------------------------------------------------------


def samconfig_overrides(path: Path, env: str = "local") -> dict[str, str]:
    """`parameter_overrides` of samconfig.toml's environment `env` (list or string form)."""
    if not path.exists():
        return {}
    doc = tomllib.loads(path.read_text())
    raw = doc.get(env, {}).get("deploy", {}).get("parameters", {}).get("parameter_overrides", [])
    return parse_overrides(raw if isinstance(raw, list) else shlex.split(raw))


def parse_overrides(items: list[str]) -> dict[str, str]:
    """["Name=Value", ...] (as `sam deploy --parameter-overrides` takes them) to a dict."""
    from sluice.cli import parse_sets
    from sluice.errors import SluiceError

    try:
        return parse_sets(items)
    except SluiceError as e:
        raise TemplateError(f"parameter overrides: {e}") from None


def parameter_values(template: dict, overrides: dict[str, str]) -> dict[str, object]:
    """Every parameter's value (defaults, then overrides), validated as CloudFormation does."""
    declared = template.get("Parameters") or {}
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        raise TemplateError(
            f"unknown parameter(s) {unknown}: the template declares {sorted(declared)}"
        )
    values: dict[str, object] = {}
    for name, spec in declared.items():
        if name in overrides:
            raw = str(overrides[name])
        elif "Default" in spec:
            raw = str(spec["Default"])
        else:
            raise TemplateError(f"parameter {name} has no default: pass {name}=VALUE")
        values[name] = _checked(name, spec, raw)
    return values


def _checked(name: str, spec: dict, raw: str) -> object:
    kind = spec.get("Type", "String")
    allowed = spec.get("AllowedValues")
    if allowed is not None and raw not in [str(a) for a in allowed]:
        raise TemplateError(f"parameter {name}={raw!r} is not one of {allowed}")
    pattern = spec.get("AllowedPattern")
    if pattern and not re.fullmatch(pattern, raw):
        raise TemplateError(f"parameter {name}={raw!r} does not match {pattern}")
    if kind == "Number":
        try:
            number = float(raw)
        except ValueError:
            raise TemplateError(f"parameter {name}={raw!r} is not a number") from None
        low, high = spec.get("MinValue"), spec.get("MaxValue")
        if (low is not None and number < float(low)) or (high is not None and number > float(high)):
            raise TemplateError(f"parameter {name}={raw} is outside [{low}, {high}]")
    if kind == "CommaDelimitedList":
        return [x.strip() for x in raw.split(",")] if raw else [""]
    return raw


# --- intrinsic functions -----------------------------------------------------------------------


class Unresolved(TemplateError):
    """A reference the resolver cannot answer (yet)."""


@dataclass
class Resolver:
    """Evaluates intrinsic functions (Ref, GetAtt, Sub, Join, If, Select, Split, conditions).

    `resources` maps a logical id to its Ref value and attributes once it exists; references to
    others raise Unresolved, so a caller can order creation by dependency.
    """

    parameters: dict[str, object]
    conditions: dict = field(default_factory=dict)
    resources: dict[str, dict] = field(default_factory=dict)  # id -> {"Ref": ..., "Arn": ...}
    stack_name: str = "sluice"

    def pseudo(self, name: str) -> object:
        return {
            "AWS::AccountId": ACCOUNT,
            "AWS::Region": REGION,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackName": self.stack_name,
            "AWS::StackId": f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{self.stack_name}/1",
            "AWS::NoValue": NO_VALUE,
            "AWS::NotificationARNs": [],
        }[name]

    def ref(self, name: str) -> object:
        if name in self.parameters:
            return self.parameters[name]
        if name.startswith("AWS::"):
            return self.pseudo(name)
        if name in self.resources:
            return self.resources[name]["Ref"]
        raise Unresolved(f"Ref {name}")

    def getatt(self, resource: str, attr: str) -> object:
        if resource in self.resources:
            attrs = self.resources[resource]
            if attr not in attrs:
                raise TemplateError(f"{resource} has no attribute {attr} locally")
            return attrs[attr]
        raise Unresolved(f"GetAtt {resource}.{attr}")

    def condition(self, value: object) -> bool:
        if isinstance(value, str):
            if value not in self.conditions:
                raise TemplateError(f"unknown condition {value}")
            return self.condition(self.conditions[value])
        if isinstance(value, bool):
            return value
        if isinstance(value, dict) and len(value) == 1:
            ((fn, args),) = value.items()
            if fn == "Condition":
                return self.condition(args)
            if fn == "Fn::Equals":
                a, b = (self.resolve(x) for x in args)
                return str(a) == str(b)
            if fn == "Fn::Not":
                return not self.condition(args[0])
            if fn == "Fn::And":
                return all(self.condition(a) for a in args)
            if fn == "Fn::Or":
                return any(self.condition(a) for a in args)
        raise TemplateError(f"cannot evaluate condition {value!r}")

    def sub(self, text: str, names: dict) -> str:
        def repl(m: re.Match) -> str:
            name = m.group(1)
            if name.startswith("!"):
                return "${" + name[1:] + "}"  # ${!Literal} is a literal ${Literal}
            if name in names:
                return _text(self.resolve(names[name]))
            if "." in name and not name.startswith("AWS::"):
                return _text(self.getatt(*name.split(".", 1)))
            return _text(self.ref(name))

        return re.sub(r"\$\{([A-Za-z0-9_:.!]+)\}", repl, text)

    def resolve(self, value: object) -> object:
        """The value with every intrinsic function evaluated (NO_VALUE entries dropped)."""
        if isinstance(value, list):
            return [v for v in (self.resolve(x) for x in value) if v is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((fn, args),) = value.items()
            if fn == "Ref":
                return self.ref(args)
            if fn == "Fn::GetAtt":
                resource, attr = args if isinstance(args, list) else args.split(".", 1)
                return self.getatt(resource, attr)
            if fn == "Fn::Sub":
                text, names = (args, {}) if isinstance(args, str) else (args[0], args[1])
                return self.sub(text, names)
            if fn == "Fn::If":
                name, yes, no = args
                return self.resolve(yes if self.condition(name) else no)
            if fn == "Fn::Join":
                sep, items = args
                return sep.join(_text(i) for i in self.resolve(items))
            if fn == "Fn::Select":
                index, items = self.resolve(args[0]), self.resolve(args[1])
                return items[int(index)]
            if fn == "Fn::Split":
                sep, text = args
                return str(self.resolve(text)).split(sep)
            if fn in ("Fn::Equals", "Fn::Not", "Fn::And", "Fn::Or", "Condition"):
                return self.condition(value)
            if fn.startswith("Fn::"):
                raise TemplateError(f"{fn} is not supported locally")
        out = {}
        for k, v in value.items():
            r = self.resolve(v)
            if r is not NO_VALUE:
                out[k] = r
        return out


def _text(value: object) -> str:
    if isinstance(value, list):
        return ",".join(_text(v) for v in value)
    return str(value)


def substitute(text: str, subs: dict) -> tuple[str, list[str]]:
    """Apply DefinitionSubstitutions as Step Functions does; return the text and undefined names."""
    missing: list[str] = []

    def repl(m: re.Match) -> str:
        name = m.group(1)
        if name not in subs:
            missing.append(name)
            return m.group(0)
        return _text(subs[name])

    return SUBSTITUTION.sub(repl, text), missing


def render_definition(text: str, subs: dict) -> tuple[str, list[str]]:
    """A state machine definition as CloudFormation hands it to Step Functions: substitutions
    applied to the file's text first, then JSON taken as is, else YAML converted to JSON (the
    order of AWS::StepFunctions::StateMachine's DefinitionS3Location handling).
    Returns the JSON text and any undefined names."""
    text, missing = substitute(text, subs)
    try:
        json.loads(text)
        return text, missing
    except json.JSONDecodeError:
        pass
    doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if not isinstance(doc, dict):
        raise ValueError("a state machine definition is a JSON or YAML mapping")
    return json.dumps(doc, indent=2), missing


# --- the SAM transform -------------------------------------------------------------------------


@dataclass
class Transformed:
    """The CloudFormation template `sam deploy` would submit, and where its local files are."""

    template: dict
    parameters: dict[str, object]
    root: Path

    def local_file(self, location: dict) -> Path | None:
        """A local code or definition path that stands in for an S3 location, or None."""
        bucket = location.get("S3Bucket") or location.get("Bucket")
        key = location.get("S3Key") or location.get("Key")
        return (self.root / key) if bucket == LOCAL_BUCKET and key else None


def transform(template_path: Path, overrides: dict[str, str]) -> Transformed:
    """SAM-transform the template with these parameter values (validated first)."""
    import boto3
    from samtranslator.parser.parser import Parser
    from samtranslator.translator.translator import Translator

    root = template_path.resolve().parent
    sam = load_template(template_path)
    values = parameter_values(sam, overrides)
    for res in (sam.get("Resources") or {}).values():
        props = res.get("Properties") or {}
        kind = res.get("Type")
        if kind == "AWS::Serverless::Function" and isinstance(props.get("CodeUri"), str):
            props["CodeUri"] = {"Bucket": LOCAL_BUCKET, "Key": props["CodeUri"].rstrip("/")}
        if kind == "AWS::Serverless::StateMachine" and isinstance(props.get("DefinitionUri"), str):
            props["DefinitionUri"] = {"Bucket": LOCAL_BUCKET, "Key": props["DefinitionUri"]}
    translator = Translator(None, Parser(), boto_session=boto3.session.Session(region_name=REGION))
    pseudo = {"AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::Partition": "aws"}
    try:
        cfn = translator.translate(
            sam,
            parameter_values={**_sam_values(values), **pseudo},
            get_managed_policy_map=dict,  # IAM is not enforced locally: no managed policy lookups
        )
    except Exception as e:  # samtranslator raises InvalidDocumentException and friends
        raise TemplateError(f"SAM transform failed: {e}") from e
    return Transformed(json.loads(json.dumps(cfn)), values, root)


def _sam_values(values: dict[str, object]) -> dict[str, object]:
    return {k: ",".join(v) if isinstance(v, list) else v for k, v in values.items()}
