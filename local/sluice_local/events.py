"""What makes things happen on their own: EventBridge rules, SQS event sources, schedules, and
Step Functions' execution events.

- Bus: events (SageMaker's state changes, PutEvents, executions) are matched against the rules
  stored in (local) EventBridge, with EventBridge's own pattern matcher (moto's), and delivered to
  their targets: Lambda functions (asynchronously), SQS queues, SNS topics, state machines.
- Poller: Lambda's SQS poller for one event source mapping: batches up to BatchSize messages or
  MaximumBatchingWindowInSeconds, deletes what succeeded (ReportBatchItemFailures), leaves the
  rest to the queue's visibility timeout and redrive policy.
- Scheduler: EventBridge Scheduler's schedules (rate, cron, at) fire on time, or on demand.
- Watcher: Step Functions' `Execution Status Change` events, which moto does not publish.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
import uuid
from calendar import monthrange
from datetime import UTC, datetime

from . import ACCOUNT, REGION
from .deploy import EventSource, send_to
from .outbox import Outbox


def event(source: str, detail_type: str, detail: dict, resources: list[str] | None = None) -> dict:
    """An event as EventBridge delivers it."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": detail_type,
        "source": source,
        "account": ACCOUNT,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": resources or [],
        "detail": detail,
    }


class Bus:
    """The default event bus: rules and targets as stored in (local) EventBridge."""

    def __init__(self, client, functions, say, outbox: Outbox | None = None):
        self.client, self.functions, self.say = client, functions, say
        self.outbox = outbox  # an event put is kept on disk until it has been delivered
        self.queue: queue.Queue = queue.Queue()
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="eventbridge")
        self.thread.start()

    def put(self, evt: dict) -> None:
        oid = self.outbox.add({"kind": "event", "event": evt}) if self.outbox else None
        self.queue.put((evt, oid))

    def requeue(self, oid: str, evt: dict) -> None:
        """An event accepted before a crash and not delivered: delivered now."""
        self.queue.put((evt, oid))

    def _loop(self) -> None:
        while not self.closed.is_set():
            try:
                evt, oid = self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self.deliver(evt)
            except Exception as e:  # one bad event must not stop the bus
                self.say("event", f"{evt.get('detail-type')}: delivery failed: {e}")
            finally:
                if self.outbox is not None and not self.closed.is_set():
                    self.outbox.done(oid)
                self.queue.task_done()

    def rules(self) -> list[dict]:
        events = self.client("events")
        rules = []
        for page in events.get_paginator("list_rules").paginate():
            rules += [r for r in page["Rules"] if r.get("EventPattern") and r["State"] == "ENABLED"]
        return rules

    def deliver(self, evt: dict) -> list[str]:
        from moto.events.models import EventPattern

        matched = []
        for rule in self.rules():
            if not EventPattern.load(rule["EventPattern"]).matches_event(evt):
                continue
            targets = self.client("events").list_targets_by_rule(Rule=rule["Name"])["Targets"]
            for target in targets:
                self.say(
                    "event",
                    f"{evt['detail-type']} -> rule {rule['Name']} -> "
                    f"{target['Arn'].split(':')[-1]}",
                )
                self._send(target, _input(target, evt))
                matched.append(rule["Name"])
        if not matched:
            self.say("event", f"{evt['detail-type']} ({_what(evt)}): no rule matched")
        return matched

    def _send(self, target: dict, payload: object) -> None:
        arn = target["Arn"]
        service = arn.split(":")[2]
        retries = int((target.get("RetryPolicy") or {}).get("MaximumRetryAttempts", 185))
        attempts = 1 + min(2, retries)  # EventBridge backs off over hours; locally, seconds
        for attempt in range(attempts):
            try:
                if service == "lambda":
                    self.functions.invoke_async(arn, payload, source="EventBridge")
                elif service in ("sqs", "sns"):
                    send_to(self.client, arn, json.dumps(payload))
                elif service == "states":
                    self.client("stepfunctions").start_execution(
                        stateMachineArn=arn, name=str(uuid.uuid4()), input=json.dumps(payload)
                    )
                else:
                    self.say("event", f"target {arn}: {service} targets are not run locally")
                return
            except Exception as e:
                if attempt + 1 < attempts:
                    time.sleep(1)
                    continue
                dlq = (target.get("DeadLetterConfig") or {}).get("Arn")
                self.say("event", f"target {arn} failed: {e}" + (f"; sent to {dlq}" if dlq else ""))
                if dlq:
                    send_to(self.client, dlq, json.dumps(payload))

    def drain(self, timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while self.queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self.closed.set()


def _input(target: dict, evt: dict) -> object:
    """What a target receives: Input, InputPath, or the whole event."""
    if "Input" in target:
        return json.loads(target["Input"])
    if "InputPath" in target:
        node: object = evt
        for part in target["InputPath"].lstrip("$").strip(".").split("."):
            if part:
                node = node.get(part) if isinstance(node, dict) else None
        return node
    return evt


def _what(evt: dict) -> str:
    d = evt.get("detail") or {}
    return next((str(v) for k, v in d.items() if k.endswith("Name") or k == "name"), evt["source"])


# --- SQS event sources -------------------------------------------------------------------------


def sqs_record(msg: dict, queue_arn: str) -> dict:
    """One SQS message as Lambda's SQS event carries it."""
    attrs = msg.get("Attributes", {})
    return {
        "messageId": msg["MessageId"],
        "receiptHandle": msg["ReceiptHandle"],
        "body": msg["Body"],
        "attributes": {
            k: attrs[k]
            for k in (
                "ApproximateReceiveCount",
                "SentTimestamp",
                "SenderId",
                "ApproximateFirstReceiveTimestamp",
            )
            if k in attrs
        },
        "messageAttributes": {
            k: {
                "stringValue": v.get("StringValue"),
                "binaryValue": v.get("BinaryValue"),
                "stringListValues": [],
                "binaryListValues": [],
                "dataType": v["DataType"],
            }
            for k, v in msg.get("MessageAttributes", {}).items()
        },
        "md5OfBody": msg.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": queue_arn,
        "awsRegion": REGION,
    }


# Without ScalingConfig.MaximumConcurrency Lambda's SQS poller scales up to 1,250 concurrent
# invocations (Lambda developer guide, services-sqs-scaling): as good as unbounded here.
UNBOUNDED_BATCHES = 1250


class Poller:
    """Lambda's poller for one SQS event source mapping.

    Batches are handed to the function concurrently, as Lambda's pollers do, up to the mapping's
    MaximumConcurrency (then the poller stops receiving until one ends). A batch handed over
    while the function already runs its ReservedConcurrentExecutions is throttled: it is not
    run, and its messages come back after the visibility timeout with one receive more, which
    counts towards the queue's maxReceiveCount (the reason MaximumConcurrency must not exceed
    the reserved concurrency)."""

    def __init__(self, source: EventSource, client, functions, say):
        self.source, self.client, self.functions, self.say = source, client, functions, say
        name = source.queue_arn.rsplit(":", 1)[1]
        self.url = client("sqs").get_queue_url(QueueName=name)["QueueUrl"]
        self.closed = threading.Event()
        self.slots = threading.Semaphore(source.max_concurrency or UNBOUNDED_BATCHES)
        self.running: set[threading.Thread] = set()
        self.thread = threading.Thread(target=self._loop, daemon=True, name=f"poller:{name}")
        self.thread.start()

    def _loop(self) -> None:
        sqs = self.client("sqs")
        while not self.closed.is_set():
            batch: list[dict] = []
            first = None
            while len(batch) < self.source.batch_size and not self.closed.is_set():
                got = sqs.receive_message(
                    QueueUrl=self.url,
                    MaxNumberOfMessages=min(10, self.source.batch_size - len(batch)),
                    WaitTimeSeconds=1,
                    AttributeNames=["All"],
                    MessageAttributeNames=["All"],
                ).get("Messages", [])
                if got and first is None:
                    first = time.monotonic()
                batch += got
                if batch and time.monotonic() - first >= self.source.window_s:
                    break
            if batch:
                self._hand_over(sqs, batch)

    def _hand_over(self, sqs, batch: list[dict]) -> None:
        """Run the batch beside the others in flight (waiting for a free one first)."""
        while not self.slots.acquire(timeout=0.5):
            if self.closed.is_set():
                return  # not run: the messages come back after their visibility timeout
        worker = threading.Thread(target=self._run, args=(sqs, batch), daemon=True)
        self.running.add(worker)
        worker.start()

    def _run(self, sqs, batch: list[dict]) -> None:
        try:
            if not self.functions.reserve(self.source.function):
                self.functions.throttled(self.source.function, f"SQS {len(batch)} message(s)")
                return  # back after the visibility timeout, one receive more
            try:
                self._invoke(sqs, batch)
            finally:
                self.functions.release(self.source.function)
        finally:
            self.slots.release()
            self.running.discard(threading.current_thread())

    def _invoke(self, sqs, batch: list[dict]) -> None:
        evt = {"Records": [sqs_record(m, self.source.queue_arn) for m in batch]}
        result = self.functions.invoke(
            self.source.function, evt, source=f"SQS {len(batch)} message(s)"
        )
        if result.error is not None:
            return  # the whole batch returns to the queue after its visibility timeout
        done = {m["MessageId"] for m in batch}
        if self.source.report_failures:
            try:
                failed = {f["itemIdentifier"] for f in result.payload["batchItemFailures"]}
            except (TypeError, KeyError):
                failed = set(done)  # an unreadable response fails the whole batch, as Lambda does
            done -= failed
        for m in batch:
            if m["MessageId"] in done:
                sqs.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])

    def close(self, wait_s: float = 60.0) -> None:
        """Stop receiving; let the batches in flight finish (at most `wait_s`)."""
        self.closed.set()
        deadline = time.monotonic() + wait_s
        for worker in list(self.running):
            worker.join(max(0.0, deadline - time.monotonic()))


# --- schedules ---------------------------------------------------------------------------------


def _field(spec: str, low: int, high: int) -> set[int]:
    """One cron field (`*`, `?`, `5`, `1-5`, `*/10`, `1,15`) as the set of values it allows."""
    if spec in ("*", "?"):
        return set(range(low, high + 1))
    out: set[int] = set()
    for part in spec.split(","):
        step = 1
        if "/" in part:
            part, step_s = part.split("/")
            step = int(step_s)
        if part in ("*", ""):
            a, b = low, high
        elif "-" in part:
            a, b = (int(x) for x in part.split("-"))
        else:
            a = int(part)
            b = high if step > 1 else a
        out |= set(range(a, b + 1, step))
    return out


DAYS = {"SUN": 1, "MON": 2, "TUE": 3, "WED": 4, "THU": 5, "FRI": 6, "SAT": 7}
MONTHS = {
    m: i
    for i, m in enumerate(
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], 1
    )
}


def cron_matches(expression: str, t: datetime) -> bool:
    """Whether an AWS cron(min hour day-of-month month day-of-week year) fires at minute t."""
    fields = expression.strip()[5:-1].split()
    if len(fields) != 6:
        raise ValueError(f"{expression}: AWS cron expressions have six fields")
    minute, hour, dom, month, dow, year = fields
    for name, n in DAYS.items():
        dow = dow.replace(name, str(n))
    for name, n in MONTHS.items():
        month = month.replace(name, str(n))
    if any(c in "".join(fields) for c in "LW#"):
        raise ValueError(f"{expression}: L, W and # are not supported locally (fire it on demand)")
    aws_dow = (t.isoweekday() % 7) + 1  # AWS: 1 = Sunday
    return (
        t.minute in _field(minute, 0, 59)
        and t.hour in _field(hour, 0, 23)
        and t.day in _field(dom, 1, monthrange(t.year, t.month)[1])
        and t.month in _field(month, 1, 12)
        and aws_dow in _field(dow, 1, 7)
        and t.year in _field(year, 1970, 2199)
    )


RATE = re.compile(r"rate\((\d+)\s+(minute|minutes|hour|hours|day|days)\)")


def rate_seconds(expression: str) -> int:
    m = RATE.fullmatch(expression.strip())
    if not m:
        raise ValueError(f"{expression} is not a rate expression")
    unit = {"minute": 60, "hour": 3600, "day": 86400}[m.group(2).rstrip("s")]
    return int(m.group(1)) * unit


class Scheduler:
    """EventBridge Scheduler: schedules (from the scheduler API) fire their Lambda targets."""

    def __init__(self, client, functions, say):
        self.client, self.functions, self.say = client, functions, say
        self.started = datetime.now(UTC)
        self.fired: dict[str, datetime] = {}
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="scheduler")
        self.thread.start()

    def schedules(self) -> list[dict]:
        scheduler = self.client("scheduler")
        names = [
            s["Name"]
            for page in scheduler.get_paginator("list_schedules").paginate()
            for s in page["Schedules"]
        ]
        return [scheduler.get_schedule(Name=n) for n in names]

    def due(self, schedule: dict, now: datetime) -> bool:
        expr = schedule["ScheduleExpression"]
        last = self.fired.get(schedule["Name"], self.started)
        if expr.startswith("rate("):
            return (now - last).total_seconds() >= rate_seconds(expr)
        if expr.startswith("cron("):
            minute = now.replace(second=0, microsecond=0)
            return minute > last.replace(second=0, microsecond=0) and cron_matches(expr, minute)
        if expr.startswith("at("):
            at = datetime.fromisoformat(expr[3:-1]).replace(tzinfo=UTC)
            return last < at <= now
        return False

    def _loop(self) -> None:
        while not self.closed.wait(5):
            now = datetime.now(UTC)
            try:
                for s in self.schedules():
                    try:
                        if s.get("State", "ENABLED") == "ENABLED" and self.due(s, now):
                            self.fire(s["Name"], s, now)
                    except ValueError as e:
                        self.say("schedule", f"{s['Name']}: {e}")
            except Exception as e:  # the endpoint may be stopping
                if not self.closed.is_set():
                    self.say("schedule", f"cannot list schedules: {e}")

    def fire(self, name: str, schedule: dict | None = None, now: datetime | None = None) -> dict:
        """Invoke a schedule's target now (as its time coming would)."""
        s = schedule or self.client("scheduler").get_schedule(Name=name)
        self.fired[name] = now or datetime.now(UTC)
        target = s["Target"]
        payload = json.loads(target["Input"]) if target.get("Input") else {}
        if ":lambda:" not in target["Arn"]:
            self.say("schedule", f"{name}: only Lambda targets run locally ({target['Arn']})")
            return {"fired": False}
        self.functions.invoke_async(target["Arn"], payload, source=f"schedule {name}")
        return {"fired": True, "target": target["Arn"].rsplit(":", 1)[1], "input": payload}

    def close(self) -> None:
        self.closed.set()


# --- Step Functions execution events -----------------------------------------------------------


class Watcher:
    """Publishes `Step Functions Execution Status Change` for the state machines' executions."""

    def __init__(self, client, bus, say, interval_s: float = 1.0):
        self.client, self.bus, self.say = client, bus, say
        self.seen: dict[str, str] = {}
        self.interval_s = interval_s
        self.closed = threading.Event()
        self._scan(publish=False)  # what existed before this start is history, not news
        self.thread = threading.Thread(target=self._loop, daemon=True, name="sfn-watcher")
        self.thread.start()

    def _loop(self) -> None:
        while not self.closed.wait(self.interval_s):
            try:
                self._scan(publish=True)
            except Exception as e:
                if not self.closed.is_set():
                    self.say("sfn", f"cannot list executions: {e}")

    def _scan(self, publish: bool) -> None:
        sfn = self.client("stepfunctions")
        for machine in sfn.list_state_machines()["stateMachines"]:
            pages = sfn.get_paginator("list_executions").paginate(
                stateMachineArn=machine["stateMachineArn"]
            )
            for page in pages:
                for ex in page["executions"]:
                    arn, status = ex["executionArn"], ex["status"]
                    if self.seen.get(arn) == status:
                        continue
                    self.seen[arn] = status
                    if publish:
                        self.publish(arn)

    def publish(self, arn: str) -> None:
        """An execution's current status as `Execution Status Change`."""
        sfn = self.client("stepfunctions")
        d = sfn.describe_execution(executionArn=arn)
        status = d["status"]
        detail = {
            "executionArn": arn,
            "stateMachineArn": d["stateMachineArn"],
            "name": d["name"],
            "status": status,
            "startDate": _ms(d.get("startDate")),
            "stopDate": _ms(d.get("stopDate")),
            "input": d.get("input"),
            "output": d.get("output"),
            "error": d.get("error"),
            "cause": d.get("cause"),
        }
        why = f": {d.get('error')}" if d.get("error") else ""
        self.say("sfn", f"execution {d['name']} {status}{why}")
        self.bus.put(event("aws.states", "Step Functions Execution Status Change", detail, [arn]))

    def close(self) -> None:
        self.closed.set()


def _ms(value) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    return int(value)
