"""Requests checked as AWS checks them on its side, from botocore's service models.

botocore validates a request's types and required members before sending it; the constraints
the service model carries beyond that (string patterns, lengths, numeric ranges, enums, list and
map sizes) are left to the service. moto enforces few of them, so a request the local stack
accepted could still be refused by AWS. This module checks them all, once:
- the local SageMaker answers every request through `check` (a violation is SageMaker's own
  ValidationException);
- `strict_clients()` makes every boto3 client in this process check its requests before sending
  them (the local stack's in-process functions and state machine interpreter, and the tests);
- tests call `problems` on the requests they capture.

Patterns are matched whole (botocore's models carry them without the `^...$` AWS documents) with
the `regex` module, which reads AWS's Java-style classes such as `\\p{L}`. The rules AWS states
only in prose (a field's notes, combinations of fields) are sluice_local.aws_rules, checked here
too.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from functools import cache

import regex
from botocore.exceptions import ClientError

ERROR_CODE = "ValidationException"


@cache
def _service(name: str):
    from botocore.session import get_session

    return get_session().get_service_model(name)


def input_shape(service: str, operation: str):
    return _service(service).operation_model(operation).input_shape


@cache
def _compiled(pattern: str):
    try:
        return regex.compile(pattern)
    except regex.error:
        return None  # a construct `regex` cannot read: not checked, rather than guessed


def problems(service: str, operation: str, params: dict) -> list[str]:
    """Each constraint of `operation`'s input that `params` breaks, in AWS's words: the service
    model's, then the rules AWS documents in prose (sluice_local.aws_rules)."""
    from . import aws_rules

    return shape_problems(params, input_shape(service, operation)) + aws_rules.problems(
        service, operation, params
    )


def request_problems(service: str, operation: str, params: dict) -> list[str]:
    """What botocore refuses before sending (types, required members), then what the service
    refuses on its side (`problems`): everything a captured request must pass."""
    from botocore.validate import ParamValidator

    report = ParamValidator().validate(params, input_shape(service, operation))
    client_side = [report.generate_report()] if report.has_errors() else []
    return client_side + problems(service, operation, params)


def shape_problems(value, shape, path: str = "") -> list[str]:
    """The constraints `value` breaks against a botocore shape (and its members)."""
    if shape is None or value is None:
        return []
    out: list[str] = []
    kind, meta = shape.type_name, shape.metadata
    low, high = meta.get("min"), meta.get("max")

    def broke(rule: str) -> None:
        shown = value if isinstance(value, int | float | str) else f"<{kind}>"
        out.append(
            f"Value {shown!r} at '{path or 'request'}' failed to satisfy constraint: "
            f"Member must {rule}"
        )

    if kind == "structure" and isinstance(value, dict):
        for name, member in shape.members.items():
            if name in value:
                out += shape_problems(value[name], member, _join(path, name))
    elif kind == "list" and isinstance(value, list | tuple):
        _size(len(value), low, high, broke)
        for i, item in enumerate(value, 1):
            out += shape_problems(item, shape.member, f"{path}.{i}.member" if path else f"{i}")
    elif kind == "map" and isinstance(value, dict):
        _size(len(value), low, high, broke)
        for k, v in value.items():
            out += shape_problems(k, shape.key, f"{path}.key")
            out += shape_problems(v, shape.value, f"{path}.{k}")
    elif kind in ("string", "blob") and isinstance(value, str | bytes):
        _size(len(value), low, high, broke)
        if kind == "string":
            if shape.enum and value not in shape.enum:
                broke(f"satisfy enum value set: [{', '.join(shape.enum)}]")
            pattern = meta.get("pattern")
            compiled = _compiled(pattern) if pattern else None
            if compiled is not None and not compiled.fullmatch(value):
                broke(f"satisfy regular expression pattern: {pattern}")
    elif kind in ("integer", "long", "float", "double") and isinstance(value, int | float):
        if low is not None and value < low:
            broke(f"have value greater than or equal to {low}")
        if high is not None and value > high:
            broke(f"have value less than or equal to {high}")
    return out


def _join(path: str, name: str) -> str:
    name = name[:1].lower() + name[1:]
    return f"{path}.{name}" if path else name


def _size(n: int, low, high, broke: Callable[[str], None]) -> None:
    if low is not None and n < low:
        broke(f"have length greater than or equal to {low}")
    if high is not None and n > high:
        broke(f"have length less than or equal to {high}")


def message(found: list[str]) -> str:
    """AWS's text for a request that breaks constraints."""
    n = len(found)
    return f"{n} validation error{'s' if n > 1 else ''} detected: " + "; ".join(found)


def check(service: str, operation: str, params: dict) -> None:
    """Raise ClientError(ValidationException), as AWS answers a request that breaks its rules."""
    found = problems(service, operation, params)
    if found:
        raise rejected(operation, found)


def rejected(operation: str, found: list[str]) -> ClientError:
    return ClientError(
        {
            "Error": {"Code": ERROR_CODE, "Message": message(found)},
            "ResponseMetadata": {"HTTPStatusCode": 400, "RequestId": str(uuid.uuid4())},
        },
        operation,
    )


# --- every client in this process ----------------------------------------------------------------

_lock = threading.Lock()
Violation = tuple[str, str, list[str]]  # service, operation, problems
_active: list[tuple[list[Violation], Callable[[Violation], None] | None]] = []


@contextlib.contextmanager
def strict_clients(
    on_violation: Callable[[Violation], None] | None = None,
) -> Iterator[list[Violation]]:
    """Within the block, every boto3/botocore client call in this process is checked against its
    service's rules first and refused as AWS would refuse it. Yields the violations seen
    (service, operation, problems), so a caller that swallows the error is still caught;
    `on_violation` also hears of each as it happens."""
    from botocore.client import BaseClient

    seen: list[Violation] = []
    entry = (seen, on_violation)
    with _lock:
        _active.append(entry)
        if len(_active) == 1:
            original = BaseClient._make_api_call

            def checked(self, operation_name, api_params):
                model = self.meta.service_model
                found = problems(model.service_name, operation_name, api_params)
                if found:
                    violation = (model.service_name, operation_name, found)
                    for record, callback in list(_active):
                        record.append(violation)
                        if callback is not None:
                            callback(violation)
                    raise rejected(operation_name, found)
                return original(self, operation_name, api_params)

            checked.original = original  # type: ignore[attr-defined]
            BaseClient._make_api_call = checked
    try:
        yield seen
    finally:
        with _lock:
            _active.remove(entry)
            if not _active:
                BaseClient._make_api_call = BaseClient._make_api_call.original
