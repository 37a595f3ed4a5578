"""Pure builders for the reports written beside a job's outputs (_SUCCESS.json, _FAILURE.json)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime


def report_key(output_uri: str, success: bool) -> str:
    """The report's key: beside the outputs, in the job's output prefix."""
    _, path = split_uri(output_uri)
    folder = path.rstrip("/") + "/" if path.strip("/") else ""
    return folder + ("_SUCCESS.json" if success else "_FAILURE.json")


def split_uri(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def parse_manifest(body: bytes) -> tuple[str, list[str]]:
    """(prefix URI, relative keys) of a SageMaker manifest file."""
    doc = json.loads(body)
    return doc[0]["prefix"], [k for k in doc[1:] if isinstance(k, str)]


def count_lines(chunks: Iterable[bytes]) -> tuple[int, int]:
    """(output lines, error lines) of a .out file, streamed: memory stays one chunk."""
    lines = errors = 0
    tail = b""
    for chunk in chunks:
        data = tail + chunk
        parts = data.split(b"\n")
        tail = parts.pop()
        for line in parts:
            lines += bool(line)
            errors += b'"error":{' in line or b'"error": {' in line
    if tail:
        lines += 1
        errors += b'"error":{' in tail or b'"error": {' in tail
    return lines, errors


def _iso(value) -> str | None:
    """EventBridge carries SageMaker timestamps as epoch milliseconds (or ISO strings)."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value / 1000, UTC).isoformat(timespec="seconds")
    return str(value)


def duration_s(detail: dict) -> float | None:
    start, end = detail.get("TransformStartTime"), detail.get("TransformEndTime")
    if isinstance(start, int | float) and isinstance(end, int | float):
        return round((end - start) / 1000, 3)
    return None


def success_report(detail: dict, inputs: list[str], files: list[dict]) -> dict:
    return {
        "job": detail["TransformJobName"],
        "status": detail["TransformJobStatus"],
        "model": detail.get("ModelName"),
        "inputs": inputs,
        "outputs": files,
        "records": sum(f["records"] for f in files),
        "error_lines": sum(f["error_lines"] for f in files),
        "started": _iso(detail.get("TransformStartTime")),
        "ended": _iso(detail.get("TransformEndTime")),
        "duration_s": duration_s(detail),
    }


def failure_report(job: str, status: str, reason: str, inputs: list[str], **extra) -> dict:
    return {
        "job": job,
        "status": status,
        "reason": reason,
        "inputs": inputs,
        "action": "fix the cause, then re-upload the inputs (or redrive the DLQ)",
        **extra,
    }
