"""Pure builders for the reports written beside a job's outputs (_SUCCESS.json, _FAILURE.json)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import IO


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


def count_lines(chunks: Iterable[bytes], failed: IO[bytes] | None = None) -> tuple[int, int]:
    """(output lines, error lines) of a .out file, streamed: memory stays one chunk.

    `failed` receives the error lines that answer OpenAI batch request lines (they carry a
    `custom_id`): the file OpenAI calls the batch's error file.
    """
    lines = errors = 0
    tail = b""

    def see(line: bytes) -> None:
        nonlocal lines, errors
        lines += 1
        if b'"error":{' in line or b'"error": {' in line:
            errors += 1
            if failed is not None and b'"custom_id":' in line:
                failed.write(line + b"\n")

    for chunk in chunks:
        parts = (tail + chunk).split(b"\n")
        tail = parts.pop()
        for line in parts:
            if line:
                see(line)
    if tail:
        see(tail)
    return lines, errors


def errors_key(out_key: str) -> str:
    """Where the failed OpenAI batch requests of `<input>.out` go: `<input>.errors.jsonl`."""
    return out_key.removesuffix(".out") + ".errors.jsonl"


def event_time(value) -> datetime | None:
    """A timestamp as SageMaker's EventBridge events carry it: epoch milliseconds (most job state
    changes) or ISO-8601 text (AWS's documented samples, e.g. "2019-05-22T21:47:19.000Z")."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value / 1000, UTC)
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _iso(value) -> str | None:
    when = event_time(value)
    return when.isoformat(timespec="seconds") if when else (None if value is None else str(value))


def duration_s(detail: dict) -> float | None:
    start = event_time(detail.get("TransformStartTime"))
    end = event_time(detail.get("TransformEndTime"))
    if start and end:
        return round((end - start).total_seconds(), 3)
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


def superseded_report(
    key: str, version: str | None, sequencer: str | None, newer: str, job: str | None
) -> dict:
    """What happened to an S3 event older than one already handled for the same key."""
    return {
        "status": "Superseded",
        "input": key,
        "version": version,
        "sequencer": sequencer,
        "newer": newer,
        "job": job,
        "reason": "S3 delivered this event after a later one for the same key; a transform job "
        "reads the key's current content, so this event started no job of its own",
        "action": "none: the newer content is (or is being) transformed"
        + (f" by {job}" if job else ""),
    }


def superseded_key(identity: str) -> str:
    """Where a superseded event's report goes: one object per object version, under outputs/."""
    import hashlib

    return f"outputs/_superseded/{hashlib.sha256(identity.encode()).hexdigest()[:32]}.json"
