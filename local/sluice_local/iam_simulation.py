"""IAM's policy simulator (`iam:SimulatePrincipalPolicy`) for the local stack, which moto lacks.

The SageMaker Python SDK calls it before it uses an execution role: a client of local Sluice
must get the verdict AWS would give for the same role. The role's own policies (inline and
attached) are evaluated as IAM evaluates identity policies: an explicit Deny wins, else an Allow
whose action, resource and conditions match, else an implicit deny. A statement whose Condition
names a key the request's ContextEntries do not supply does not apply, and the key is reported
in MissingContextValues, as the simulator does. Permissions boundaries, SCPs and resource
policies are not part of the local stack: they are reported as allowing.
"""

from __future__ import annotations

import fnmatch
import json
from urllib.parse import unquote

OPERATORS = {
    "StringEquals": lambda value, pattern: value == pattern,
    "StringNotEquals": lambda value, pattern: value != pattern,
    "StringEqualsIgnoreCase": lambda value, pattern: value.lower() == pattern.lower(),
    "StringLike": lambda value, pattern: fnmatch.fnmatchcase(value, pattern),
    "StringNotLike": lambda value, pattern: not fnmatch.fnmatchcase(value, pattern),
    "ArnEquals": lambda value, pattern: value == pattern,
    "ArnLike": lambda value, pattern: fnmatch.fnmatchcase(value, pattern),
    "Bool": lambda value, pattern: value.lower() == str(pattern).lower(),
}


def _list(value) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def _matches(value: str, patterns: list[str], case: bool) -> bool:
    if not case:
        value = value.lower()
        patterns = [p.lower() for p in patterns]
    return any(fnmatch.fnmatchcase(value, p) for p in patterns)


def _condition(statement: dict, context: dict[str, list[str]]) -> tuple[bool, list[str]]:
    """(the condition holds, the context keys it needed that the request lacked)."""
    missing: list[str] = []
    holds = True
    for operator, tests in (statement.get("Condition") or {}).items():
        check = OPERATORS.get(operator.removesuffix("IfExists"))
        for key, patterns in tests.items():
            values = next((v for k, v in context.items() if k.lower() == key.lower()), None)
            if values is None:
                if not operator.endswith("IfExists"):
                    missing.append(key)
                    holds = False
                continue
            if check is None or not any(check(v, str(p)) for v in values for p in _list(patterns)):
                holds = False
    return holds, missing


def _applies(statement: dict, action: str, resource: str) -> bool:
    if "Action" in statement:
        if not _matches(action, _list(statement["Action"]), case=False):
            return False
    elif _matches(action, _list(statement.get("NotAction")), case=False):
        return False
    if "Resource" in statement:
        return _matches(resource, _list(statement["Resource"]), case=True)
    return not _matches(resource, _list(statement.get("NotResource")), case=True)


def evaluate(
    policies: list[tuple[str, str, dict]],
    actions: list[str],
    resources: list[str],
    context: dict[str, list[str]],
) -> list[dict]:
    """EvaluationResults for each action (and resource) under (id, type, document) policies."""
    results = []
    for action in actions:
        for resource in resources or ["*"]:
            allowed, denied, missing = [], [], []
            for policy_id, policy_type, doc in policies:
                for st in _list(doc.get("Statement")):
                    if not _applies(st, action, resource):
                        continue
                    holds, lacking = _condition(st, context)
                    missing += [k for k in lacking if k not in missing]
                    if not holds:
                        continue
                    source = {"SourcePolicyId": policy_id, "SourcePolicyType": policy_type}
                    (denied if st.get("Effect") == "Deny" else allowed).append(source)
            decision = "explicitDeny" if denied else "allowed" if allowed else "implicitDeny"
            results.append(
                {
                    "EvalActionName": action,
                    "EvalResourceName": resource,
                    "EvalDecision": decision,
                    "MatchedStatements": denied or allowed,
                    "MissingContextValues": missing,
                    "OrganizationsDecisionDetail": {"AllowedByOrganizations": True},
                    "PermissionsBoundaryDecisionDetail": {"AllowedByPermissionsBoundary": True},
                }
            )
    return results


def role_policies(backend, role_name: str) -> list[tuple[str, str, dict]]:
    """A role's inline and attached managed policies as (id, type, document)."""
    role = backend.get_role(role_name)
    found = []
    for name in backend.list_role_policies(role_name):
        _, document = backend.get_role_policy(role_name, name)
        found.append((name, "IAM Policy", _document(document)))
    for policy in role.managed_policies.values():
        version = next(v for v in policy.versions if v.is_default)
        found.append((policy.name, "IAM Policy", _document(version.document)))
    return found


def _document(document) -> dict:
    if isinstance(document, dict):
        return document
    return json.loads(unquote(document))


def simulate_principal_policy(response) -> object:
    """moto's IamResponse method for SimulatePrincipalPolicy (installed by moto_fixes)."""
    from moto.core.responses import ActionResult
    from moto.iam.exceptions import NotFoundException

    arn = response._get_param("PolicySourceArn")
    if ":role/" not in arn:
        raise NotFoundException(f"Only roles are simulated locally, not {arn}.")
    name = arn.rsplit("/", 1)[1]
    policies = role_policies(response.backend, name)
    context = {
        e["ContextKeyName"]: _list(e.get("ContextKeyValues"))
        for e in response._get_param("ContextEntries", []) or []
    }
    results = evaluate(
        policies,
        response._get_param("ActionNames", []),
        response._get_param("ResourceArns", []) or [],
        context,
    )
    return ActionResult({"EvaluationResults": results, "IsTruncated": False})
