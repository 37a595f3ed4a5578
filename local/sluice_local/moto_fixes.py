"""Where moto's Step Functions interpreter differs from Step Functions, and the local fix.

Each entry names the difference; none changes what a definition means.
"""

from __future__ import annotations

# aws-sdk task ARNs name Application Auto Scaling `applicationautoscaling`; boto3 knows it as
# `application-autoscaling`, and moto's interpreter maps only some services' names.
SFN_SERVICE_NAMES = {"applicationautoscaling": "application-autoscaling"}


def service_names() -> dict[str, str]:
    """moto's Step Functions-to-boto3 service names with the ones it misses."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
        state_task_service,
    )

    names = dict(state_task_service.StateTaskService._SERVICE_NAME_SFN_TO_BOTO_OVERRIDES)
    names.update(SFN_SERVICE_NAMES)
    return names


def bucket_permission(bucket, action: str, resource: str):
    """A bucket policy's verdict on an object request, IAM's way.

    moto answers DENIED for any statement whose Condition it cannot confirm, so the template's
    `Deny ... if aws:SecureTransport is false` refused every request. In IAM a statement whose
    condition does not hold does not apply; moto has no request context to confirm one, so such a
    statement is left out here (the local endpoint is plain HTTP on loopback).
    """
    import json

    from moto.iam.access_control import IAMPolicyStatement, PermissionResult

    if bucket.policy is None:
        return PermissionResult.NEUTRAL
    doc = json.loads(bucket.policy)
    statements = doc.get("Statement", [])
    result = PermissionResult.NEUTRAL
    for st in statements if isinstance(statements, list) else [statements]:
        if st.get("Condition"):
            continue
        verdict = IAMPolicyStatement(st).is_action_permitted(action, resource)
        if verdict == PermissionResult.DENIED:
            return verdict
        if verdict == PermissionResult.PERMITTED:
            result = verdict
    return result


def apply() -> None:
    """Install the fixes in this process (the local stack's)."""
    from moto.s3.models import FakeBucket
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
        state_task_service,
    )

    state_task_service.StateTaskService._SERVICE_NAME_SFN_TO_BOTO_OVERRIDES = service_names()
    FakeBucket.get_permission = bucket_permission
