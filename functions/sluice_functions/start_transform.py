"""start_transform: an SQS batch of S3 upload events -> SageMaker Batch Transform job(s).

The whole batch is coalesced into one job over a manifest (split only where the per-job limits
require), named from its content so a redelivered batch finds its job already there. A batch
whose job *failed* is not swallowed when its messages come back (a crash before they were
deleted, or an operator's redrive from the DLQ after fixing the cause): it runs again under the
next attempt's name (SageMaker never reuses a job name), at most MAX_ATTEMPTS times, then its
messages go back to the queue and on to the DLQ; a job that failed because SageMaker found no
instances (CapacityError: transform_finished sent its uploads back to wait) is not an attempt.
Work that cannot start *yet* (the account's instance quota reached, CreateTransformJob throttled)
is sent back to the queue with a delay and never counts towards the DLQ (waiting.py); other
errors report those messages as batch item failures (retried, then the DLQ); messages that are
not S3 events are logged, counted and acknowledged.
"""

from __future__ import annotations

import json
import os
import time

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import SQSEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError

from . import claims, waiting
from .aws import (
    already_exists,
    client,
    current_model,
    error_code,
    sagemaker_job,
    sagemaker_job_status,
)
from .batching import (
    Parsed,
    Settings,
    Upload,
    dedupe,
    job_manifest,
    job_name,
    newest_per_key,
    parse_message,
    plan_jobs,
    transform_request,
    uploads_key,
)
from .reports import failure_report, report_key, superseded_key, superseded_report

# service name and metrics namespace: POWERTOOLS_SERVICE_NAME and POWERTOOLS_METRICS_NAMESPACE,
# set once in template.yaml
logger = Logger()
metrics = Metrics()


class NoModel(Exception):
    """No model to transform with yet (the SSM parameter still holds its placeholder)."""


def model_or_raise() -> str:
    parameter = os.environ["MODEL_PARAMETER"]
    name = current_model(parameter)
    if name is None:
        raise NoModel(
            f"no model yet: SSM parameter {parameter} holds its placeholder; train and promote a "
            "first model (see README: bootstrap the first model)"
        )
    return name


MAX_ATTEMPTS = 3  # jobs one batch may run as, the first and two after failures
# names of a batch's earlier jobs looked at: its failures, plus the jobs that found no capacity
# (those do not count as attempts: MaxWaitHours bounds them, in transform_finished)
MAX_NAMES = 200


class Contended(Exception):
    """Another invocation claimed some of these uploads first: retry them later."""


class AttemptsExhausted(Exception):
    """Every attempt's job for this batch failed: the messages go on to the DLQ."""


def start_job(
    settings: Settings,
    model: str,
    group: list[Upload],
    table: str | None,
    waited: waiting.Waiting,
) -> str:
    """Claim the uploads, write the manifest, create the job; 'started' or 'duplicate'."""
    failures = 0
    for attempt in range(MAX_NAMES):
        name = job_name(settings.stage, group, attempt)
        job = sagemaker_job("describe_transform_job", TransformJobName=name)
        if job is None:
            break
        if job["TransformJobStatus"] != "Failed":
            logger.info("job already exists: a redelivered batch", extra={"job": name})
            return "duplicate"
        if waiting.is_capacity_failure(job.get("FailureReason")):
            logger.info("this batch's job found no capacity: trying again", extra={"job": name})
            continue
        failures += 1
        if failures >= MAX_ATTEMPTS:
            raise AttemptsExhausted(name)
        logger.warning(
            "this batch's job failed: running it again under a new name",
            extra={"failed_job": name, "attempt": failures + 1},
        )
    else:
        raise AttemptsExhausted(name)
    if table and claims.claim(table, group, name):
        claims.release(table, group, name)
        raise Contended(name)
    try:
        _create(settings, model, group, name, waited)
    except ClientError:
        if table:
            claims.release(table, group, name)
        raise
    return "started"


def _create(
    settings: Settings, model: str, group: list[Upload], name: str, waited: waiting.Waiting
) -> None:
    """Write the manifest and the uploads file, then CreateTransformJob (an existing job counts
    as done)."""
    s3 = client("s3")
    body = job_manifest(settings, [u.key for u in group])
    key = f"manifests/{name}.json"
    s3.put_object(
        Bucket=settings.bucket,
        Key=key,
        Body=json.dumps(body).encode(),
        ContentType="application/json",
    )
    uploads = {**waited.record(), "uploads": [u.record() for u in group]}
    s3.put_object(
        Bucket=settings.bucket,
        Key=uploads_key(name),
        Body=json.dumps(uploads).encode(),
        ContentType="application/json",
    )
    try:
        client("sagemaker").create_transform_job(
            **transform_request(settings, model, name, key, group)
        )
    except ClientError as e:
        if already_exists(e):
            logger.info("job already exists: a redelivered batch", extra={"job": name})
            return
        raise
    logger.info("transform job started", extra={"job": name, "files": len(group)})


def job_status(name: str) -> str | None:
    return sagemaker_job_status(
        "describe_transform_job", "TransformJobStatus", TransformJobName=name
    )


def report_not_started(
    settings: Settings, uploads: list[Upload], status: str, reason: str, subject: str
) -> None:
    """A failure report an operator can act on, and a notification; the messages go back to
    SQS (then the DLQ)."""
    name = job_name(settings.stage, uploads)
    report = failure_report(name, status, reason, [u.key for u in uploads])
    client("s3").put_object(
        Bucket=settings.bucket,
        Key=report_key(f"s3://{settings.bucket}/outputs/{name}/", False),
        Body=json.dumps(report, indent=2).encode(),
        ContentType="application/json",
    )
    topic = os.environ.get("TOPIC_ARN")
    if topic:
        client("sns").publish(
            TopicArn=topic,
            Subject=f"Sluice {settings.stage}: {subject} for {len(uploads)} uploads",
            Message=json.dumps(report, indent=2),
        )


@metrics.log_metrics
@logger.inject_lambda_context
@event_source(data_class=SQSEvent)
def handler(event: SQSEvent, context: LambdaContext) -> dict:
    settings = Settings.from_env(dict(os.environ))
    parsed = Parsed()
    first_receipt = set()
    for rec in event.records:
        parse_message(rec.message_id, rec.body, settings, parsed)
        if rec.attributes.approximate_receive_count == "1":
            first_receipt.add(rec.message_id)
    for skip in parsed.skipped:
        logger.info("skipped", extra={"reason": skip.reason, "key": skip.key})
    for bad in parsed.malformed:
        logger.error(
            "malformed message acknowledged",
            extra={"message_id": bad.message_id, "reason": bad.reason},
        )
    metrics.add_metric("Skipped", MetricUnit.Count, len(parsed.skipped))
    metrics.add_metric("MalformedMessages", MetricUnit.Count, len(parsed.malformed))
    uploads, in_batch = newest_per_key(dedupe(parsed.uploads))
    older = [(u, newer.identity, None) for u, newer in in_batch]
    table = os.environ.get("CLAIMS_TABLE")
    failed: set[str] = set()
    if table and uploads:
        seen = claims.sort_uploads(table, uploads, job_status)
        for u, job in seen.duplicates:
            logger.info("duplicate upload: already in a job", extra={"key": u.key, "job": job})
        metrics.add_metric("DuplicateUploads", MetricUnit.Count, len(seen.duplicates))
        for u, job in seen.failed:  # its job failed: hand the claim back, run it again
            logger.warning(
                "upload of a failed job delivered again", extra={"key": u.key, "job": job}
            )
            claims.release(table, [u], job)
        failed |= {u.message_id for u in seen.in_flight}
        uploads = seen.fresh + [u for u, _ in seen.failed]
        stale = claims.keep_latest(table, uploads)
        older += stale
        superseded = {u for u, _, _ in stale}
        uploads = [u for u in uploads if u not in superseded]
    for u, newer, job in older:
        # acknowledged, not transformed: a job already has (or will read) the key's newer content
        report = superseded_report(u.key, u.version_id, u.sequencer, newer, job)
        logger.warning("superseded upload: a later event for this key came first", extra=report)
        client("s3").put_object(
            Bucket=settings.bucket,
            Key=superseded_key(u.identity),
            Body=json.dumps(report, indent=2).encode(),
            ContentType="application/json",
        )
    metrics.add_metric("SupersededUploads", MetricUnit.Count, len(older))
    if not uploads:
        return failures(failed)
    metrics.add_metric("Files", MetricUnit.Count, len(uploads))
    metrics.add_metric("Bytes", MetricUnit.Bytes, sum(u.size for u in uploads))

    try:
        model = model_or_raise()
    except NoModel as e:
        logger.error(str(e), extra={"files": len(uploads)})
        metrics.add_metric("NoModel", MetricUnit.Count, 1)
        if any(u.message_id in first_receipt for u in uploads):
            report_not_started(settings, uploads, "NoModel", str(e), "no model")
        return failures(failed | {u.message_id for u in uploads})

    now = time.time()
    waited = {  # how long each message's work has waited already (waiting.py)
        rec.message_id: waiting.Waiting.of(rec.raw_event.get("messageAttributes") or {}, now)
        for rec in event.records
    }
    later: list[Upload] = []  # uploads whose job cannot start yet: sent back to wait
    for group in plan_jobs(uploads, settings.max_files, settings.max_bytes, settings.content_type):
        try:
            group_waited = waiting.Waiting.of_all([waited[u.message_id] for u in group], now)
            outcome = start_job(settings, model, group, table, group_waited)
            metrics.add_metric(
                "JobsStarted" if outcome == "started" else "DuplicateBatches", MetricUnit.Count, 1
            )
        except ClientError as e:
            code, detail = error_code(e), e.response.get("Error", {}).get("Message", "")
            cannot_wait = waiting.why_waiting_cannot_help(code, detail)
            keys = [u.key for u in group]
            if cannot_wait is None:
                logger.warning(
                    "transform job cannot start yet: its uploads wait in the queue",
                    extra={"error": code, "detail": detail, "keys": keys},
                )
                later += group
                continue
            logger.error(
                "could not start transform job",
                extra={"error": code, "detail": detail, "why": cannot_wait, "keys": keys},
            )
            metrics.add_metric("StartFailures", MetricUnit.Count, 1)
            if code == "ResourceLimitExceeded" and any(
                u.message_id in first_receipt for u in group
            ):
                report_not_started(settings, group, code, cannot_wait, "quota too small")
            # the uploads are valid: retry, then the DLQ keeps them
            failed |= {u.message_id for u in group}
        except Contended as e:
            logger.warning("uploads claimed by another invocation; retrying", extra={"job": str(e)})
            failed |= {u.message_id for u in group}
        except AttemptsExhausted as e:
            logger.error(
                f"this batch failed as {MAX_ATTEMPTS} jobs; its messages go on to the DLQ",
                extra={"last_job": str(e), "keys": [u.key for u in group]},
            )
            metrics.add_metric("BatchesGivenUp", MetricUnit.Count, 1)
            failed |= {u.message_id for u in group}
    if later:
        records = {rec.message_id: rec for rec in event.records}
        waiting_ids = {u.message_id for u in later} - failed
        back = [records[m] for m in sorted(waiting_ids)]
        failed |= wait_in_queue(settings, back, later, waited, now)
    return failures(failed)


def wait_in_queue(
    settings: Settings,
    records: list,
    uploads: list[Upload],
    waited: dict[str, waiting.Waiting],
    now: float,
) -> set[str]:
    """Send these messages back to the queue, delayed, and acknowledge them (waiting.py; how
    long each has waited: `waited`, by message id); the ids of those that could not be (past
    the stack's wait limit, or SendMessage failed), which go back as batch item failures."""
    failed: set[str] = set()
    kept: dict[str, tuple[str, waiting.Waiting]] = {}
    for rec in records:
        state = waited[rec.message_id]
        if state.expired(now, settings.max_wait_s):
            failed.add(rec.message_id)
            mine = [u for u in uploads if u.message_id == rec.message_id]
            reason = (
                f"waited {(now - state.since) / 3600:.1f} h for the account's SageMaker quota "
                f"(MaxWaitHours {settings.max_wait_s / 3600:g}); raise the quota in Service Quotas "
                "or redrive the DLQ once jobs have finished"
            )
            logger.error("gave up waiting for capacity", extra={"keys": [u.key for u in mine]})
            metrics.add_metric("WaitsGivenUp", MetricUnit.Count, 1)
            if rec.attributes.approximate_receive_count == "1":
                report_not_started(settings, mine, "QuotaWaitExpired", reason, "gave up waiting")
            continue
        kept[rec.message_id] = (rec.body, state)
    ids = list(kept)
    resent = waiting.resend_entries(list(kept.values()), settings.wait_first_s)
    for entry_id, why in waiting.send_back(client("sqs"), settings.queue_url, resent).items():
        logger.error("could not send uploads back to wait", extra={"error": why})
        failed.add(ids[int(entry_id)])
    waited = len(ids) - len(failed & set(ids))
    metrics.add_metric("UploadsWaiting", MetricUnit.Count, waited)
    logger.info("uploads sent back to wait for capacity", extra={"messages": waited})
    return failed


def failures(message_ids: set[str]) -> dict:
    return {"batchItemFailures": [{"itemIdentifier": m} for m in sorted(message_ids)]}
