"""What starts a retrain, and when: pure decisions over the pending-trigger record.

Every trigger (new training data, the schedule, an operator, drift) adds to one pending record.
A retrain starts when the record is due and no retrain is running; until then the record keeps
every trigger it gathered, so one that arrives during a retrain is started after it, not lost.
New data is debounced: a bulk upload of hundreds of files starts one retrain, once enough has
arrived (objects or bytes) or the uploads have gone quiet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

REASONS = ("new-data", "schedule", "manual", "drift")
# Precedence when several triggers share a window: the execution is named after the strongest.
PRIORITY = {"drift": 0, "manual": 1, "schedule": 2, "new-data": 3}
EXECUTION_NAME_MAX = 80  # Step Functions: 1-80 of [A-Za-z0-9-_]
MAX_VIOLATIONS = 20  # kept in the execution input (its limit is 256 KB)


@dataclass(frozen=True)
class TriggerSettings:
    """The trigger function's configuration (its environment)."""

    min_objects: int = 10
    min_bytes: int = 100 * 2**20
    quiet_s: int = 1800
    training_prefix: str = "training/"
    validation_prefix: str = "validation/"

    @classmethod
    def from_env(cls, env: dict[str, str]) -> TriggerSettings:
        return cls(
            min_objects=int(env.get("RETRAIN_MIN_OBJECTS", cls.min_objects)),
            min_bytes=int(env.get("RETRAIN_MIN_BYTES", cls.min_bytes)),
            quiet_s=int(env.get("RETRAIN_QUIET_SECONDS", cls.quiet_s)),
            training_prefix=env.get("TRAINING_PREFIX", cls.training_prefix),
            validation_prefix=env.get("VALIDATION_PREFIX", cls.validation_prefix),
        )


@dataclass
class Pending:
    """Triggers gathered since the last retrain started (one DynamoDB item)."""

    window: int  # epoch seconds of the first trigger: names the execution
    last_seen: int
    objects: int = 0
    bytes: int = 0
    reasons: set[str] = field(default_factory=set)
    violations: list[dict] = field(default_factory=list)
    hyperparameters: dict = field(default_factory=dict)


def due(p: Pending, now: int, s: TriggerSettings) -> str | None:
    """Why the pending triggers should start a retrain now, or None to keep waiting."""
    if p.reasons - {"new-data"}:
        return "requested: " + ", ".join(sorted(p.reasons - {"new-data"}))
    if not p.objects:
        return None
    if p.objects >= s.min_objects:
        return f"{p.objects} new objects >= {s.min_objects}"
    if p.bytes >= s.min_bytes:
        return f"{p.bytes} new bytes >= {s.min_bytes}"
    if now - p.last_seen >= s.quiet_s:
        return f"uploads quiet for {now - p.last_seen} s >= {s.quiet_s} s"
    return None


def primary_reason(p: Pending) -> str:
    return min(p.reasons or {"new-data"}, key=lambda r: PRIORITY.get(r, 9))


def execution_name(p: Pending) -> str:
    """Deterministic per trigger window: two starters of one window start one execution."""
    stamp = datetime.fromtimestamp(p.window, UTC).strftime("%Y%m%dT%H%M%SZ")
    name = re.sub(r"[^A-Za-z0-9_-]", "-", f"{primary_reason(p)}-{stamp}")
    return name[:EXECUTION_NAME_MAX]


def execution_input(p: Pending, bucket: str, s: TriggerSettings, has_validation: bool) -> dict:
    """The state machine's input: why, on what data, with which overrides."""
    doc: dict = {
        "reason": primary_reason(p),
        "reasons": sorted(p.reasons or {"new-data"}),
        "trainingData": f"s3://{bucket}/{s.training_prefix}",
        "newObjects": p.objects,
        "newBytes": p.bytes,
        "violations": p.violations[:MAX_VIOLATIONS],
        "hyperparameters": {str(k): str(v) for k, v in p.hyperparameters.items()},
    }
    if has_validation:
        doc["validationData"] = f"s3://{bucket}/{s.validation_prefix}"
    return doc
