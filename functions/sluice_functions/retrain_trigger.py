"""retrain_trigger: every way a retrain starts goes through here, and through one guard.

One entry point per event source, each a function of its own in template.yaml: `on_uploads`
(SQS batches of S3 events under training/: new data), `on_monitoring` (EventBridge: a monitoring
job finished; drift, see drift.py) and `on_command` (direct invocations: a sweep every few minutes
from EventBridge Scheduler that starts what is due, the optional retraining schedule, and manual
requests, `aws lambda invoke --payload '{"action": "manual"}'`). Each adds to one pending record
in DynamoDB (atomic counters, so concurrent invocations lose nothing); a retrain starts when the
record is due (see retrain.due) and no execution is running, under a name derived from its
trigger window, so two invocations racing over one window start one execution.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.data_classes import EventBridgeEvent, SQSEvent, event_source
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError

from .aws import client, error_code
from .batching import Parsed, Settings, dedupe, parse_message
from .drift import outcome as monitor_outcome
from .reports import split_uri
from .retrain import (
    MAX_VIOLATIONS,
    Pending,
    TriggerSettings,
    due,
    execution_input,
    execution_name,
)

# service name and metrics namespace: POWERTOOLS_SERVICE_NAME and POWERTOOLS_METRICS_NAMESPACE,
# set once in template.yaml
logger = Logger()
metrics = Metrics()
KEY = {"trigger": {"S": "pending"}}
TRAINING_SUFFIXES = (".txt", ".jsonl", ".json", ".csv", ".gz")
PROCESSING_JOB_STATE_CHANGE = "SageMaker Processing Job State Change"
SEEN_TTL_S = 30 * 86400  # how long a delivered object or job is remembered (the table's TTL)


def add(
    table: str,
    reason: str,
    objects: int = 0,
    size: int = 0,
    *,
    now: int,
    violations: list[dict] | None = None,
    hyperparameters: dict | None = None,
    once: str | None = None,
) -> bool:
    """Record one trigger in the pending record (created on first use).

    With `once` (an object's identity, a monitoring job's ARN), the trigger counts only the first
    time that identity is seen, however often it is delivered: a marker item and the pending
    update are written in one transaction. Returns False for a repeat.
    """
    names = {"#w": "window", "#l": "last_seen", "#o": "objects", "#b": "bytes", "#r": "reasons"}
    values = {
        ":now": {"N": str(now)},
        ":o": {"N": str(objects)},
        ":b": {"N": str(size)},
        ":r": {"SS": [reason]},
    }
    sets = ["#w = if_not_exists(#w, :now)", "#l = :now"]
    if violations is not None:
        names["#v"], values[":v"] = "violations", {"S": json.dumps(violations)}
        sets.append("#v = :v")
    if hyperparameters:
        names["#h"], values[":h"] = "hyperparameters", {"S": json.dumps(hyperparameters)}
        sets.append("#h = :h")
    update = {
        "TableName": table,
        "Key": KEY,
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
        "UpdateExpression": f"SET {', '.join(sets)} ADD #o :o, #b :b, #r :r",
    }
    if once is None:
        client("dynamodb").update_item(**update)
        return True
    try:
        client("dynamodb").transact_write_items(
            TransactItems=[{"Put": seen_marker(table, once, now)}, {"Update": update}]
        )
        return True
    except ClientError as e:
        if error_code(e) == "TransactionCanceledException" and _marker_existed(e):
            return False
        raise


def seen_marker(table: str, identity: str, now: int) -> dict:
    """A Put that succeeds only the first time `identity` is seen (kept SEEN_TTL_S)."""
    return {
        "TableName": table,
        "Item": {
            "trigger": {"S": f"seen#{identity}"},
            "expires": {"N": str(now + SEEN_TTL_S)},
        },
        "ConditionExpression": "attribute_not_exists(#t)",
        "ExpressionAttributeNames": {"#t": "trigger"},
    }


def _marker_existed(e: ClientError) -> bool:
    reasons = e.response.get("CancellationReasons") or []
    return bool(reasons) and reasons[0].get("Code") == "ConditionalCheckFailed"


def mark_seen(table: str, identity: str, now: int) -> bool:
    """Record `identity` as handled; False if it already was (a repeated delivery)."""
    try:
        client("dynamodb").put_item(**seen_marker(table, identity, now))
        return True
    except ClientError as e:
        if error_code(e) == "ConditionalCheckFailedException":
            return False
        raise


def load(table: str) -> Pending | None:
    item = client("dynamodb").get_item(TableName=table, Key=KEY, ConsistentRead=True).get("Item")
    if not item:
        return None
    return Pending(
        window=int(item["window"]["N"]),
        last_seen=int(item["last_seen"]["N"]),
        objects=int(item.get("objects", {}).get("N", 0)),
        bytes=int(item.get("bytes", {}).get("N", 0)),
        reasons=set(item.get("reasons", {}).get("SS", [])),
        violations=json.loads(item.get("violations", {}).get("S", "[]")),
        hyperparameters=json.loads(item.get("hyperparameters", {}).get("S", "{}")),
    )


def consume(table: str, p: Pending, now: int) -> None:
    """Remove what a started retrain covered; triggers that arrived meanwhile stay pending."""
    ddb = client("dynamodb")
    try:
        ddb.delete_item(
            TableName=table,
            Key=KEY,
            ConditionExpression="#w = :w AND #l = :l",
            ExpressionAttributeNames={"#w": "window", "#l": "last_seen"},
            ExpressionAttributeValues={":w": {"N": str(p.window)}, ":l": {"N": str(p.last_seen)}},
        )
        return
    except ClientError as e:
        if error_code(e) != "ConditionalCheckFailedException":
            raise
    # something arrived after we read: subtract what this retrain took, start a new window
    try:
        ddb.update_item(
            TableName=table,
            Key=KEY,
            ConditionExpression="#w = :w",
            UpdateExpression="SET #w = :now ADD #o :o, #b :b DELETE #r :r",
            ExpressionAttributeNames={
                "#w": "window",
                "#o": "objects",
                "#b": "bytes",
                "#r": "reasons",
            },
            ExpressionAttributeValues={
                ":w": {"N": str(p.window)},
                ":now": {"N": str(now)},
                ":o": {"N": str(-p.objects)},
                ":b": {"N": str(-p.bytes)},
                ":r": {"SS": sorted(p.reasons or {"new-data"})},
            },
        )
    except ClientError as e:
        if error_code(e) != "ConditionalCheckFailedException":
            raise
        logger.info("pending record already consumed by another invocation")


def running(state_machine: str) -> str | None:
    """The name of a running retrain, if any (the no-concurrent-retrain guard)."""
    found = client("stepfunctions").list_executions(
        stateMachineArn=state_machine, statusFilter="RUNNING", maxResults=1
    )["executions"]
    return found[0]["name"] if found else None


def has_objects(bucket: str, prefix: str) -> bool:
    return client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)["KeyCount"] > 0


def process(env: dict[str, str], now: int) -> dict:
    """Start a retrain if one is due and none is running; say what happened and why."""
    table, arn, bucket = env["RETRAIN_TABLE"], env["STATE_MACHINE_ARN"], env["DATA_BUCKET"]
    settings = TriggerSettings.from_env(env)
    p = load(table)
    if p is None:
        return {"outcome": "idle"}
    why = due(p, now, settings)
    if why is None:
        logger.info("retrain not due yet", extra={"objects": p.objects, "bytes": p.bytes})
        return {"outcome": "waiting", "objects": p.objects}
    busy = running(arn)
    if busy:
        logger.info("retrain deferred: another is running", extra={"running": busy, "why": why})
        metrics.add_metric("RetrainsDeferred", MetricUnit.Count, 1)
        return {"outcome": "deferred", "running": busy}
    name = execution_name(p)
    doc = execution_input(p, bucket, settings, has_objects(bucket, settings.validation_prefix))
    try:
        client("stepfunctions").start_execution(
            stateMachineArn=arn, name=name, input=json.dumps(doc)
        )
        metrics.add_metric("RetrainsStarted", MetricUnit.Count, 1)
        logger.info("retrain started", extra={"execution": name, "why": why, "input": doc})
    except ClientError as e:
        if error_code(e) != "ExecutionAlreadyExists":
            raise
        logger.info("retrain for this window already started", extra={"execution": name})
    consume(table, p, now)
    return {"outcome": "started", "execution": name, "why": why}


def record_uploads(event: SQSEvent, env: dict[str, str], now: int) -> tuple[int, list[str]]:
    """Count new training objects in an SQS batch of S3 events, each object version once however
    often S3 and SQS deliver it. Returns how many were new and the messages to retry."""
    settings = Settings(
        stage=env.get("STAGE", ""),
        bucket=env["DATA_BUCKET"],
        incoming_prefix=TriggerSettings.from_env(env).training_prefix,
        suffixes=TRAINING_SUFFIXES,
    )
    parsed = Parsed()
    for rec in event.records:
        parse_message(rec.message_id, rec.body, settings, parsed)
    for bad in parsed.malformed:
        logger.error("malformed message acknowledged", extra={"reason": bad.reason})
    for skip in parsed.skipped:
        logger.info("skipped", extra={"reason": skip.reason, "key": skip.key})
    new, retry = 0, []
    for u in dedupe(parsed.uploads):
        try:
            if add(env["RETRAIN_TABLE"], "new-data", 1, u.size, now=now, once=u.identity):
                new += 1
            else:
                logger.info("repeated delivery: already counted", extra={"object": u.identity})
        except ClientError as e:
            logger.warning("could not record an upload", extra={"error": str(e), "object": u.key})
            retry.append(u.message_id)
    return new, retry


def read_s3(uri: str) -> bytes:
    bucket, key = split_uri(uri)
    return client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()


def notify(env: dict[str, str], subject: str, doc: dict) -> None:
    topic = env.get("TOPIC_ARN")
    if topic:
        client("sns").publish(TopicArn=topic, Subject=subject[:100], Message=json.dumps(doc))


def record_monitoring(detail: dict, env: dict[str, str], now: int) -> dict:
    """A monitoring job finished: drift adds a `drift` trigger; a broken monitor is reported.
    Each job counts once, whatever the number of deliveries (SageMaker may repeat an event)."""
    result = monitor_outcome(detail, read_s3)
    job = detail.get("ProcessingJobArn") or result.job
    doc = {"job": result.job, "outcome": result.kind, "reason": result.reason}
    table = env["RETRAIN_TABLE"]
    if result.kind == "drift":
        # capped as the execution input caps them: the pending record stays far from 400 KB
        violations = result.violations[:MAX_VIOLATIONS]
        if not add(table, "drift", now=now, violations=violations, once=f"monitor#{job}"):
            return _repeated(doc, job)
        metrics.add_metric("DriftViolations", MetricUnit.Count, len(result.violations))
        logger.warning("drift: retrain requested", extra={**doc, "violations": result.violations})
        started = process(env, now)
        notify(
            env,
            f"Sluice {env.get('STAGE', '')}: drift detected",
            {**doc, "violations": result.violations, "retrain": started},
        )
        return {**doc, "retrain": started}
    if not mark_seen(table, f"monitor#{job}", now):
        return _repeated(doc, job)
    if result.kind == "monitoring-failed":
        logger.error("monitoring failed: not treated as drift", extra=doc)
        metrics.add_metric("MonitoringFailures", MetricUnit.Count, 1)
        notify(env, f"Sluice {env.get('STAGE', '')}: monitoring failed", doc)
        return doc
    metrics.add_metric("DriftViolations", MetricUnit.Count, 0)
    logger.info("no drift", extra=doc)
    return doc


def _repeated(doc: dict, job: str) -> dict:
    logger.info("repeated monitoring event: already handled", extra={"job": job})
    metrics.add_metric("RepeatedEvents", MetricUnit.Count, 1)
    return {**doc, "outcome": "repeated", "first_outcome": doc["outcome"]}


@dataclass(frozen=True)
class Command:
    """A direct invocation: `{"action": "sweep" | "schedule" | "manual", "hyperparameters": {}}`.

    `sweep` comes every few minutes from EventBridge Scheduler (starts what is due), `schedule`
    from the optional retraining schedule, `manual` from an operator (`aws lambda invoke`).
    """

    action: str
    hyperparameters: dict

    ACTIONS = ("sweep", "schedule", "manual")

    @classmethod
    def parse(cls, event: object) -> Command:
        if not isinstance(event, dict) or event.get("action") not in cls.ACTIONS:
            got = event.get("action") if isinstance(event, dict) else type(event).__name__
            raise ValueError(f"expected {{'action': one of {list(cls.ACTIONS)}}}, got {got!r}")
        hyperparameters = event.get("hyperparameters") or {}
        if not isinstance(hyperparameters, dict):
            raise ValueError("hyperparameters must be an object of NAME: VALUE")
        return cls(event["action"], hyperparameters)


@metrics.log_metrics
@logger.inject_lambda_context
@event_source(data_class=SQSEvent)
def on_uploads(event: SQSEvent, context: LambdaContext) -> dict:
    """SQS batches of S3 events under training/: count new data, start a retrain when due."""
    env, now = dict(os.environ), int(time.time())
    new, retry = record_uploads(event, env, now)
    metrics.add_metric("NewTrainingObjects", MetricUnit.Count, new)
    # partial batch response: only messages whose objects could not be recorded come back
    failures = {"batchItemFailures": [{"itemIdentifier": m} for m in dict.fromkeys(retry)]}
    try:
        return {**process(env, now), **failures}
    except ClientError as e:
        # the uploads are recorded (a redelivery would not count them again); the sweep starts
        # the retrain instead
        logger.error("could not start a retrain; the sweep will", extra={"error": str(e)})
        return {"outcome": "error", "error": error_code(e), **failures}


@metrics.log_metrics
@logger.inject_lambda_context
@event_source(data_class=EventBridgeEvent)
def on_monitoring(event: EventBridgeEvent, context: LambdaContext) -> dict:
    """A monitoring job (Processing job or Model Monitor execution) changed state."""
    if event.detail_type != PROCESSING_JOB_STATE_CHANGE:
        logger.error("unexpected event acknowledged", extra={"detail_type": event.detail_type})
        return {"outcome": "ignored"}
    return record_monitoring(event.detail or {}, dict(os.environ), int(time.time()))


@metrics.log_metrics
@logger.inject_lambda_context
def on_command(event: dict, context: LambdaContext) -> dict:
    """A sweep, a scheduled retrain or a manual one (see Command)."""
    env, now = dict(os.environ), int(time.time())
    try:
        command = Command.parse(event)
    except ValueError as e:
        # a malformed direct invocation will not improve on retry: say why and stop
        logger.error("invalid command acknowledged", extra={"error": str(e)})
        return {"outcome": "ignored", "error": str(e)}
    if command.action != "sweep":
        add(
            env["RETRAIN_TABLE"],
            command.action,
            now=now,
            hyperparameters=command.hyperparameters or None,
        )
    return process(env, now)
