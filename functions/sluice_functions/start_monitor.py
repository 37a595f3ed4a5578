"""start_monitor: the scheduled drift check, in either MonitoringMode.

Processing (the default, open to every account): each window, one Processing job running
`sluice monitor` over the capture written in that window (endpoint capture files, and the inputs
and outputs that batch capture manifests name, listed into one manifest), against the current
champion's baseline. `{"end": "now"}` checks the window ending now instead of the last complete
one (an operator who will not wait for the hour). ModelMonitor: keep a monitoring schedule on
the endpoint pointed at the current champion's baseline (created, or updated after a promotion).
Either way the job's completion reaches retrain_trigger, which turns violations into a retrain.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError

from .aws import already_exists, client, current_model, error_code, sagemaker_job_status
from .monitoring import (
    MonitorSettings,
    baseline_prefix,
    batch_capture_keys,
    capture_manifest,
    cron_for,
    endpoint_capture_prefixes,
    in_window,
    job_name,
    processing_request,
    requested_window,
    schedule_name,
    schedule_request,
)

# service name and metrics namespace: POWERTOOLS_SERVICE_NAME and POWERTOOLS_METRICS_NAMESPACE,
# set once in template.yaml
logger = Logger()
metrics = Metrics()


def has_baseline(bucket: str, model: str) -> bool:
    try:
        client("s3").head_object(Bucket=bucket, Key=baseline_prefix(model) + "statistics.json")
        return True
    except ClientError as e:
        if error_code(e) in ("404", "NoSuchKey", "NotFound"):
            return False
        raise


def capture_keys(s: MonitorSettings, start: datetime, end: datetime) -> list[str]:
    """What the window's capture holds: endpoint capture files (by their hour folders), and the
    inputs and outputs of the transform jobs whose batch capture manifests were written in it."""
    s3 = client("s3")
    keys = []
    for prefix in [*endpoint_capture_prefixes(s.endpoint, start, end), "capture/batch/"]:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=s.bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                key = o["Key"]
                if key.endswith("/") or not in_window(o["LastModified"], start, end):
                    continue
                named = None
                if prefix == "capture/batch/":
                    body = s3.get_object(Bucket=s.bucket, Key=key)["Body"].read()
                    named = batch_capture_keys(s.bucket, body)
                keys += [key] if named is None else named
    return sorted(set(keys))


def start_processing(s: MonitorSettings, model: str, start: datetime, end: datetime) -> dict:
    name = job_name(s.stage, start)
    if sagemaker_job_status(
        "describe_processing_job", "ProcessingJobStatus", ProcessingJobName=name
    ):
        logger.info("monitor job for this window already exists", extra={"job": name})
        return {"outcome": "duplicate", "job": name}
    keys = capture_keys(s, start, end)
    if not keys:
        logger.info("no capture in the window: nothing to check", extra={"job": name})
        metrics.add_metric("EmptyWindows", MetricUnit.Count, 1)
        return {"outcome": "empty", "job": name}
    manifest_key = f"manifests/{name}.json"
    client("s3").put_object(
        Bucket=s.bucket,
        Key=manifest_key,
        Body=json.dumps(capture_manifest(s.bucket, keys)).encode(),
    )
    try:
        client("sagemaker").create_processing_job(
            **processing_request(s, name, model, manifest_key, start, end)
        )
    except ClientError as e:
        if not already_exists(e):
            raise
        logger.info("monitor job for this window already exists", extra={"job": name})
        return {"outcome": "duplicate", "job": name}
    metrics.add_metric("MonitorJobsStarted", MetricUnit.Count, 1)
    logger.info("monitor job started", extra={"job": name, "objects": len(keys)})
    return {"outcome": "started", "job": name, "objects": len(keys)}


def ensure_schedule(s: MonitorSettings, model: str) -> dict:
    """ModelMonitor mode: one schedule on the endpoint, always on the champion's baseline."""
    sm = client("sagemaker")
    name = schedule_name(s.stage)
    request = schedule_request(s, model, cron_for(s.window_s))
    try:
        current = sm.describe_monitoring_schedule(MonitoringScheduleName=name)
    except ClientError as e:
        if error_code(e) not in ("ResourceNotFound", "ValidationException"):
            raise
        sm.create_monitoring_schedule(**request)
        logger.info("monitoring schedule created", extra={"schedule": name, "champion": model})
        return {"outcome": "created", "schedule": name}
    env = current["MonitoringScheduleConfig"]["MonitoringJobDefinition"].get("Environment", {})
    if env.get("SLUICE_CHAMPION") == model:
        return {"outcome": "current", "schedule": name}
    sm.update_monitoring_schedule(**request)
    logger.info("monitoring schedule moved to the new champion", extra={"champion": model})
    return {"outcome": "updated", "schedule": name}


@metrics.log_metrics
@logger.inject_lambda_context
def handler(event: dict, context: LambdaContext) -> dict:
    env = dict(os.environ)
    s = MonitorSettings.from_env(env)
    model = current_model(env["MODEL_PARAMETER"])
    if model is None:
        logger.info("no champion yet: nothing to monitor")
        return {"outcome": "no-model"}
    if not has_baseline(s.bucket, model):
        # the baseline job runs after each promotion; until it is done there is nothing to
        # compare with, which must not look like "no drift"
        logger.error(
            "no baseline for the champion yet",
            extra={"champion": model, "expected": f"s3://{s.bucket}/{baseline_prefix(model)}"},
        )
        metrics.add_metric("BaselineMissing", MetricUnit.Count, 1)
        return {"outcome": "no-baseline", "champion": model}
    if env.get("MONITORING_MODE", "Processing") == "ModelMonitor":
        return ensure_schedule(s, model)
    start, end = requested_window(event, datetime.now(UTC), s.window_s)
    return start_processing(s, model, start, end)
