"""Pure builders for the reports written beside a job's outputs (_SUCCESS.json, _FAILURE.json)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import IO

from .prices import job_cost

# a result line's token usage, as `serve` writes it (native lines and OpenAI bodies alike)
USAGE = re.compile(rb'"prompt_tokens":\s*(\d+),\s*"completion_tokens":\s*(\d+)')


@dataclass
class Counts:
    """What one output file holds: lines, error lines, and the tokens its results used."""

    records: int = 0
    error_lines: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


def report_key(output_uri: str, success: bool, filename: str | None = None) -> str:
    """The report's key: beside the outputs, in the job's output prefix (`filename` for other
    reports than _SUCCESS.json / _FAILURE.json)."""
    _, path = split_uri(output_uri)
    folder = path.rstrip("/") + "/" if path.strip("/") else ""
    return folder + (filename or ("_SUCCESS.json" if success else "_FAILURE.json"))


def split_uri(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def parse_manifest(body: bytes) -> tuple[str, list[str]]:
    """(prefix URI, relative keys) of a SageMaker manifest file."""
    doc = json.loads(body)
    return doc[0]["prefix"], [k for k in doc[1:] if isinstance(k, str)]


def count_lines(chunks: Iterable[bytes], failed: IO[bytes] | None = None) -> Counts:
    """Lines, error lines and token usage of a .out file, streamed: memory stays one chunk.

    `failed` receives the error lines that answer OpenAI batch request lines (they carry a
    `custom_id`): the file OpenAI calls the batch's error file.
    """
    counts = Counts()
    tail = b""

    def see(line: bytes) -> None:
        counts.records += 1
        if b'"error":{' in line or b'"error": {' in line:
            counts.error_lines += 1
            if failed is not None and b'"custom_id":' in line:
                failed.write(line + b"\n")
        used = USAGE.search(line)
        if used:
            counts.input_tokens += int(used[1])
            counts.output_tokens += int(used[2])

    for chunk in chunks:
        parts = (tail + chunk).split(b"\n")
        tail = parts.pop()
        for line in parts:
            if line:
                see(line)
    if tail:
        see(tail)
    return counts


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


def success_report(
    detail: dict, inputs: list[str], files: list[dict], price_per_hour: str = ""
) -> dict:
    """_SUCCESS.json: the inputs, each output's counts, and the job's sums, time and cost."""
    seconds = duration_s(detail)
    resources = detail.get("TransformResources") or {}
    count = resources.get("InstanceCount") or 1
    instance_seconds = None if seconds is None else round(seconds * count, 3)
    return {
        "job": detail["TransformJobName"],
        "status": detail["TransformJobStatus"],
        "model": detail.get("ModelName"),
        "inputs": inputs,
        "outputs": files,
        **{k: sum(f.get(k, 0) for f in files) for k in asdict(Counts())},
        "started": _iso(detail.get("TransformStartTime")),
        "ended": _iso(detail.get("TransformEndTime")),
        "duration_s": seconds,
        "instance_type": resources.get("InstanceType"),
        "instance_count": count,
        "instance_seconds": instance_seconds,
        "cost": job_cost(resources.get("InstanceType"), instance_seconds, price_per_hour),
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


def _took(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(round(seconds), 60)
    return f" in {minutes} min {secs} s" if minutes else f" in {secs} s"


def _listed(uris: list[str], shown: int = 5) -> str:
    more = f" and {len(uris) - shown} more" if len(uris) > shown else ""
    return ", ".join(uris[:shown]) + more


# SNS Publish: "Message ... must be less than 256 KB (262,144 bytes)" (UTF-8; API reference,
# Publish); a larger one is refused with InvalidParameter and the notification is lost
SNS_MAX_BYTES = 262_144 - 1


def notification(report: dict, report_uri: str) -> tuple[str, str]:
    """(subject, message) a person reads: what happened, where the outputs are, how many
    records and errors, how long, what it cost; the report's JSON follows for tools."""
    job, status = report["job"], report["status"]
    folder = report_uri.rsplit("/", 1)[0] + "/"
    if status == "Completed":
        cost = (report.get("cost") or {}).get("usd")
        lines = [
            f"Transform job {job} completed{_took(report.get('duration_s'))}.",
            f"{len(report['inputs'])} input file(s): {report['records']} records, "
            f"{report['error_lines']} error lines; {report['input_tokens']} tokens in, "
            f"{report['output_tokens']} out"
            + (
                f"; about ${cost:.2f} ({report['instance_type']} x{report['instance_count']})."
                if cost is not None
                else "."
            ),
            f"Outputs: {folder} (each input's <name>.out, under its path below incoming/)",
        ]
    else:
        lines = [
            f"Transform job {job}: {status}{_took(report.get('duration_s'))}.",
            f"Why: {report['reason']}",
            f"Inputs ({len(report['inputs'])}): {_listed(report['inputs'])}",
            f"What to do: {report['action']}. Runbook: docs/batch.md#transform-jobs-failed",
        ]
    lines += [f"Report: {report_uri}", ""]
    message = "\n".join([*lines, json.dumps(report, indent=2)])
    if len(message.encode()) > SNS_MAX_BYTES:  # a job of a thousand files: its lists stay in S3
        brief = {k: v for k, v in report.items() if k not in ("inputs", "outputs")}
        brief["inputs_count"] = len(report.get("inputs", []))
        brief["outputs_count"] = len(report.get("outputs", []))
        brief["lists"] = f"inputs and outputs: too long for a notification; see {report_uri}"
        message = "\n".join([*lines, json.dumps(brief, indent=2)])
    return f"Sluice transform {status.lower()}: {job}"[:100], message
