"""Requests and answers in SageMaker's own shapes, from botocore's service model.

Every request is validated as SageMaker validates it (types and required members as botocore
checks them, then the service-side rules of sluice_local.validation: patterns, lengths, ranges,
enums; LocalSageMaker.call adds the rules AWS documents in prose, sluice_local.aws_rules); every
answer is rendered through the operation's output shape, so a client sees exactly the members
SageMaker would send, timestamps as epoch seconds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache

from botocore.validate import ParamValidator

from ..validation import message, shape_problems


class ApiError(Exception):
    """A SageMaker error answer: its code (`__type`), message and HTTP status."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


@cache
def model(service: str = "sagemaker"):
    from botocore.session import get_session

    return get_session().get_service_model(service)


def operation(name: str, service: str = "sagemaker"):
    try:
        return model(service).operation_model(name)
    except Exception:
        raise ApiError("UnknownOperationException", f"unknown operation {name}") from None


def parse_input(value, shape):
    """JSON-protocol input to Python values: epoch-second timestamps become datetimes."""
    if shape is None or value is None:
        return value
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        return {k: parse_input(v, shape.members.get(k)) for k, v in value.items()}
    if kind == "list" and isinstance(value, list):
        return [parse_input(v, shape.member) for v in value]
    if kind == "map" and isinstance(value, dict):
        return {k: parse_input(v, shape.value) for k, v in value.items()}
    if kind == "timestamp" and isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    return value


def validate(op_name: str, params: dict) -> dict:
    """The request, checked against the operation's input shape; ValidationException if not."""
    op = operation(op_name)
    shape = op.input_shape
    params = parse_input(params, shape)
    report = ParamValidator().validate(params, shape)
    if report.has_errors():
        raise ApiError("ValidationException", report.generate_report())
    found = shape_problems(params, shape)
    if found:
        raise ApiError("ValidationException", message(found))
    return params


def render(value, shape):
    """A value in the output shape: unknown members dropped, timestamps as epoch seconds."""
    if shape is None or value is None:
        return None
    kind = shape.type_name
    if kind == "structure":
        if not isinstance(value, dict):
            return None
        out = {}
        for name, member in shape.members.items():
            if name in value and value[name] is not None:
                rendered = render(value[name], member)
                if rendered is not None:
                    out[name] = rendered
        return out
    if kind == "list":
        return [render(v, shape.member) for v in value]
    if kind == "map":
        return {k: render(v, shape.value) for k, v in value.items()}
    if kind == "timestamp":
        return value.timestamp() if isinstance(value, datetime) else float(value)
    if kind in ("integer", "long"):
        return int(value)
    if kind in ("float", "double"):
        return float(value)
    if kind == "boolean":
        return bool(value)
    return value


def output(op_name: str, doc: dict) -> dict:
    return render(doc, operation(op_name).output_shape) or {}


def member_shape(op_name: str, *path: str):
    """The shape at a path inside an operation's output (e.g. a List call's summary item)."""
    shape = operation(op_name).output_shape
    for step in path:
        shape = shape.member if step == "[]" else shape.members[step]
    return shape
