"""transform_finished: SageMaker Transform Job State Change -> _SUCCESS.json / _FAILURE.json.

Completed: a summary beside the outputs (inputs, outputs with record, error-line and token
counts, the job's sums, duration, instance-seconds and cost), EMF metrics of the same, and
for OpenAI batch inputs the failed requests copied to `<input>.errors.jsonl`.
Failed or Stopped: the FailureReason and the input keys (from the claims table when the manifest
cannot be read), and an SNS notification.
SageMaker may deliver the same event twice: the report is written only if absent, so the
notification goes out once.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError

from . import claims
from .aws import client, error_code
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
