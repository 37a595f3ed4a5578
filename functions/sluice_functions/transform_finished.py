"""transform_finished: SageMaker Transform Job State Change -> _SUCCESS.json / _FAILURE.json.

Completed: a summary beside the outputs (inputs, outputs with record, error-line and token
counts, the job's sums, duration, instance-seconds and cost), EMF metrics of the same, and
for OpenAI batch inputs the failed requests copied to `<input>.errors.jsonl`.
Failed or Stopped: the FailureReason and the input keys (from the claims table when the manifest
cannot be read), and an SNS notification.
Failed because SageMaker found no instances (`CapacityError`): waiting, not failing. The job's
uploads go back to the incoming queue as S3 notifications, delayed as quota waits are
(waiting.py), and run in a new job; `_WAITING.json` says so. Past MaxWaitHours it is a failure.
SageMaker may deliver the same event twice: the report is written only if absent, so the
notification goes out once.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError

from . import claims, waiting
from .aws import client, error_code
from .batching import Settings, Upload, uploads_key
from .reports import (
    Counts,
    count_lines,
    duration_s,
    errors_key,
    failure_report,
    notification,
    parse_manifest,
    report_key,
    split_uri,
    success_report,
)

# service name and metrics namespace: POWERTOOLS_SERVICE_NAME and POWERTOOLS_METRICS_NAMESPACE,
# set once in template.yaml
logger = Logger()
metrics = Metrics()
FINAL = {"Completed", "Failed", "Stopped"}
# per completed job: metric name, _SUCCESS.json field, unit
JOB_METRICS = (
    ("Records", "records", MetricUnit.Count),
    ("ErrorLines", "error_lines", MetricUnit.Count),
    ("InputTokens", "input_tokens", MetricUnit.Count),
    ("OutputTokens", "output_tokens", MetricUnit.Count),
    ("InstanceSeconds", "instance_seconds", MetricUnit.Seconds),
)


def input_keys(detail: dict) -> tuple[str, list[str]]:
    """(input prefix URI, relative keys) from the job's manifest (or its S3 prefix)."""
    source = detail["TransformInput"]["DataSource"]["S3DataSource"]
    uri = source["S3Uri"]
    if source.get("S3DataType") != "ManifestFile":
        return uri, [""]
    bucket, key = split_uri(uri)
    try:
        body = client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
        return parse_manifest(body)
    except (ClientError, ValueError, KeyError, IndexError) as e:
        logger.warning("manifest unreadable", extra={"manifest": uri, "error": str(e)})
        return uri, []


def output_counts(output_uri: str, prefix: str, keys: list[str]) -> list[dict]:
    s3 = client("s3")
    bucket, out_prefix = split_uri(output_uri.rstrip("/") + "/")
    files = []
    for rel in keys:
        key = f"{out_prefix}{rel}.out"
        try:
            body = s3.get_object(Bucket=bucket, Key=key)["Body"]
            # spooled: a large error file goes to /tmp, not into the function's memory
            with tempfile.SpooledTemporaryFile(max_size=8 << 20) as failed:
                counts = count_lines(body.iter_chunks(1 << 20), failed)
                entry = {"input": prefix + rel, "output": f"s3://{bucket}/{key}", **asdict(counts)}
                if failed.tell():
                    failed.seek(0)
                    s3.upload_fileobj(failed, bucket, errors_key(key))
                    entry["errors"] = f"s3://{bucket}/{errors_key(key)}"
            files.append(entry)
        except ClientError as e:
            files.append(
                {
                    "input": prefix + rel,
                    "output": None,
                    **asdict(Counts()),
                    "missing": error_code(e),
                }
            )
    return files


def write_once(uri: str, key: str, report: dict) -> bool:
    """Write the report unless it exists (a duplicate event); True when this call wrote it."""
    bucket, _ = split_uri(uri)
    try:
        client("s3").put_object(
            Bucket=bucket,
            Key=key,
            Body=json.dumps(report, indent=2).encode(),
            ContentType="application/json",
            IfNoneMatch="*",
        )
        return True
    except ClientError as e:
        if error_code(e) in ("PreconditionFailed", "ConditionalRequestConflict"):
            return False
        raise


def notify(report: dict, output_uri: str, key: str) -> None:
    """The job's report to the topic, in words a person reads first (reports.notification)."""
    bucket, _ = split_uri(output_uri)
    subject, message = notification(report, f"s3://{bucket}/{key}")
    client("sns").publish(TopicArn=os.environ["TOPIC_ARN"], Subject=subject, Message=message)


def read_uploads(bucket: str, name: str) -> dict | None:
    """The job's uploads file (start_transform wrote it), or None (a job from before it)."""
    try:
        body = client("s3").get_object(Bucket=bucket, Key=uploads_key(name))["Body"].read()
        return json.loads(body)
    except ClientError as e:  # without s3:ListBucket a missing key answers AccessDenied
        if error_code(e) in ("NoSuchKey", "AccessDenied", "404", "403"):
            return None
        raise


def wait_for_capacity(name: str, detail: dict, output_uri: str) -> dict | None:
    """A job SageMaker found no instances for: send its uploads back to the queue to run in a
    new job (waiting.py), and write `_WAITING.json`; None when it cannot wait (no uploads file,
    or it waited past MaxWaitHours): then it is reported as failed."""
    settings = Settings.from_env(dict(os.environ))
    doc = read_uploads(settings.bucket, name)  # where start_transform wrote it
    if doc is None or not settings.queue_url:
        return None
    now = time.time()
    waited = waiting.Waiting.from_record(doc, now)
    if waited.expired(now, settings.max_wait_s):
        # reported as a failed job (JobsFailed pages, as for any failed job)
        logger.error("gave up waiting for capacity", extra={"job": name, "since": waited.since})
        return None
    region = os.environ.get("AWS_REGION", "us-east-1")
    uploads = [Upload("", **u) for u in doc["uploads"]]
    entries = waiting.resend_entries(
        [(u.notification(region), waited) for u in uploads], settings.wait_first_s
    )
    # sent before the report is written: a retried invocation sends them again, and the claims
    # drop the copies (start_transform), where a report written first could lose them
    not_sent = waiting.send_back(client("sqs"), settings.queue_url, entries)
    if not_sent:
        raise RuntimeError(f"could not send {len(not_sent)} uploads back to wait: {not_sent}")
    report = {
        "job": name,
        "status": "Failed",
        "reason": detail.get("FailureReason"),
        "waiting": (
            "SageMaker found no instances for this job: its uploads went back to the queue "
            "and run in a new job (docs/batch.md, waiting is not failing)"
        ),
        "uploads": [f"s3://{u.bucket}/{u.key}" for u in uploads],
        "waits": waited.waits + 1,
        "waiting_since": waited.since,
        "next_try_in_s": entries[0]["DelaySeconds"] if entries else None,
    }
    key = report_key(output_uri, False, "_WAITING.json")
    wrote = write_once(output_uri, key, report)
    metrics.add_metric("CapacityWaits", MetricUnit.Count, int(wrote))
    metrics.add_metric("UploadsWaiting", MetricUnit.Count, len(uploads) if wrote else 0)
    logger.warning(
        "no capacity for this job: its uploads wait in the queue",
        extra={"uploads": len(uploads), "reason": detail.get("FailureReason"), "report": key},
    )
    return {"job": name, "status": "Failed", "report": key, "written": wrote, "waiting": True}


@metrics.log_metrics
@logger.inject_lambda_context
@event_source(data_class=EventBridgeEvent)
def handler(event: EventBridgeEvent, context: LambdaContext) -> dict:
    detail = event.detail
    name, status = detail.get("TransformJobName"), detail.get("TransformJobStatus")
    if not name or status not in FINAL:
        logger.info("ignored", extra={"job": name, "status": status})
        return {"job": name, "status": status, "action": "ignored"}
    logger.append_keys(correlation_id=name)
    output_uri = detail["TransformOutput"]["S3OutputPath"]
    if status == "Failed" and waiting.is_capacity_failure(detail.get("FailureReason")):
        waited = wait_for_capacity(name, detail, output_uri)
        if waited is not None:
            return waited
    prefix, keys = input_keys(detail)
    inputs = [prefix + k for k in keys]
    extra = {}
    table = os.environ.get("CLAIMS_TABLE")
    if not keys and table:  # the manifest is gone: the claims still name the uploads
        inputs = claims.uploads_of(table, name)
        extra = {"inputs_from": "claims (the job's manifest could not be read)"}
    if status == "Completed":
        files = output_counts(output_uri, prefix, keys)
        price = os.environ.get("TRANSFORM_PRICE_PER_HOUR", "")
        report = success_report(detail, inputs, files, price)
        key = report_key(output_uri, True)
        wrote = write_once(output_uri, key, report)
        metrics.add_metric("JobsCompleted", MetricUnit.Count, int(wrote))
        # a duplicate event adds zeros: each job's figures count once
        for metric, field, unit in JOB_METRICS:
            metrics.add_metric(metric, unit, (report[field] or 0) if wrote else 0)
        if wrote and report["duration_s"] is not None:  # percentiles: never a duplicate's zero
            metrics.add_metric("JobSeconds", MetricUnit.Seconds, report["duration_s"])
        if wrote and os.environ.get("NOTIFY_ON_SUCCESS", "true").lower() == "true":
            notify(report, output_uri, key)
    else:
        report = failure_report(
            name,
            status,
            detail.get("FailureReason") or f"job {status.lower()}",
            inputs,
            model=detail.get("ModelName"),
            duration_s=duration_s(detail),
            **extra,
        )
        key = report_key(output_uri, False)
        wrote = write_once(output_uri, key, report)
        if wrote:
            metrics.add_metric("JobsFailed", MetricUnit.Count, 1)
            notify(report, output_uri, key)
    logger.info("report", extra={"key": key, "written": wrote, "status": status})
    return {"job": name, "status": status, "report": key, "written": wrote}
