"""From a finished monitoring job to a decision: drift, no drift, or a monitoring failure.

Sluice's monitor job (as a Model Monitor schedule or a plain Processing job) writes Model Monitor's
`constraint_violations.json` into its output. Missing or malformed outputs are a monitoring
failure, never drift: a broken monitor must not retrain models, and must not go unnoticed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

VIOLATIONS_FILE = "constraint_violations.json"


@dataclass
class MonitorOutcome:
    kind: str  # drift | no-drift | monitoring-failed
    job: str
    reason: str = ""
    violations: list[dict] = field(default_factory=list)


def violations_uri(detail: dict) -> str | None:
    """Where the job wrote constraint_violations.json (its first S3 output)."""
    outputs = (detail.get("ProcessingOutputConfig") or {}).get("Outputs") or []
    for out in outputs:
        uri = (out.get("S3Output") or {}).get("S3Uri")
        if uri:
            return uri.rstrip("/") + "/" + VIOLATIONS_FILE
    return None


def parse_violations(body: bytes) -> list[dict]:
    """The `violations` of a constraint_violations.json; ValueError if it is not one."""
    doc = json.loads(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("violations"), list):
        raise ValueError("no `violations` list")
    out = []
    for v in doc["violations"]:
        if not isinstance(v, dict) or not {"feature_name", "constraint_check_type"} <= set(v):
            raise ValueError(f"violation without feature_name/constraint_check_type: {v!r}")
        out.append(
            {k: v[k] for k in ("feature_name", "constraint_check_type", "description") if k in v}
        )
    return out


def outcome(detail: dict, fetch: Callable[[str], bytes]) -> MonitorOutcome:
    """Classify a `SageMaker Processing Job State Change` detail; `fetch` reads an S3 URI."""
    job = detail.get("ProcessingJobName", "?")
    status = detail.get("ProcessingJobStatus")
    if status != "Completed":
        why = detail.get("FailureReason") or detail.get("ExitMessage") or "no reason given"
        return MonitorOutcome("monitoring-failed", job, f"job {status}: {why}")
    uri = violations_uri(detail)
    if uri is None:
        return MonitorOutcome("monitoring-failed", job, "the job has no S3 output")
    try:
        body = fetch(uri)
    except Exception as e:  # NoSuchKey, AccessDenied, ...: each is a monitor that did not report
        return MonitorOutcome("monitoring-failed", job, f"cannot read {uri}: {e}")
    try:
        violations = parse_violations(body)
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        return MonitorOutcome("monitoring-failed", job, f"malformed {uri}: {e}")
    if not violations:
        return MonitorOutcome("no-drift", job)
    names = sorted({v["feature_name"] for v in violations})
    return MonitorOutcome(
        "drift", job, f"{len(violations)} violation(s): {', '.join(names)}", violations
    )
