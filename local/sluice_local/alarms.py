"""CloudWatch's side of the local stack: the metrics AWS services publish, and alarms evaluated.

moto stores metrics and alarms but publishes no service metrics and never evaluates an alarm.
Here, as AWS does:
- SQS publishes each queue's ApproximateNumberOfMessagesVisible, ...Delayed and
  ApproximateAgeOfOldestMessage (namespace AWS/SQS, dimension QueueName) every few seconds (AWS:
  every minute); Lambda's per-invocation metrics are put by `lambdas.Functions`.
- Each alarm is evaluated over its last EvaluationPeriods periods (its metric, or its metric math:
  FILL, MAX, SUM and +, what template.yaml uses), missing data as TreatMissingData says; a change
  of state is set on the alarm (StateReason in CloudWatch's words) and, into ALARM, published to
  its AlarmActions topics as CloudWatch's JSON message.
"""

from __future__ import annotations

import json
import operator
import re
import threading
import time
from datetime import UTC, datetime

from . import ACCOUNT, REGION

REGION_NAME = {"us-east-1": "US East (N. Virginia)"}
COMPARE = {
    "GreaterThanOrEqualToThreshold": (operator.ge, "greater than or equal to"),
    "GreaterThanThreshold": (operator.gt, "greater than"),
    "LessThanThreshold": (operator.lt, "less than"),
    "LessThanOrEqualToThreshold": (operator.le, "less than or equal to"),
}
_EXPRESSION = re.compile(r"^[\w\s\[\],.+\-*/()]+$")


def fill(value, default):
    return default if value is None else value


def _max(values):
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _sum(values):
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def evaluate(expression: str, values: dict[str, float | None]) -> float | None:
    """One metric-math expression at one point in time (None: no data)."""
    if not _EXPRESSION.match(expression):
        raise ValueError(f"unsupported metric math: {expression}")
    names = {"FILL": fill, "MAX": _max, "SUM": _sum, **values}
    try:
        return eval(expression, {"__builtins__": {}}, names)  # the characters checked above
    except TypeError:  # None + x: no data
        return None


class Alarms:
    """Evaluates every alarm of the local CloudWatch each `interval_s` seconds."""

    def __init__(self, client, say, interval_s: float = 5.0, start: bool = True):
        self.client, self.say, self.interval_s = client, say, interval_s
        self.closed = threading.Event()
        self.queues: dict[str, tuple] = {}  # what each queue's metrics said last
        self.thread = threading.Thread(target=self._loop, daemon=True, name="alarms")
        if start:
            self.thread.start()

    def _loop(self) -> None:
        while not self.closed.wait(self.interval_s):
            try:
                publish_queue_metrics(self.client, self.queues)
                for alarm in self.client("cloudwatch").describe_alarms()["MetricAlarms"]:
                    self.evaluate(alarm)
            except Exception as e:  # the stack stopping, or one bad alarm: say, carry on
                if not self.closed.is_set():
                    self.say("alarm", f"evaluation failed: {e}")

    def series(self, alarm: dict, now: float) -> list[float | None]:
        """The alarm's value in each of its last EvaluationPeriods periods, oldest first."""
        queries = alarm.get("Metrics") or [
            {
                "Id": "m",
                "ReturnData": True,
                "MetricStat": {
                    "Metric": {
                        "Namespace": alarm["Namespace"],
                        "MetricName": alarm["MetricName"],
                        "Dimensions": alarm.get("Dimensions", []),
                    },
                    "Period": alarm["Period"],
                    "Stat": alarm["Statistic"],
                },
            }
        ]
        periods = alarm["EvaluationPeriods"]
        period = next(q["MetricStat"]["Period"] for q in queries if "MetricStat" in q)
        first = (int(now) // period - periods + 1) * period
        buckets = [first + i * period for i in range(periods)]
        data = {
            q["Id"]: self._stat(q["MetricStat"], buckets, now) for q in queries if "MetricStat" in q
        }
        shown = next(q for q in queries if q.get("ReturnData", True))
        if "MetricStat" in shown:
            return data[shown["Id"]]
        return [
            evaluate(shown["Expression"], {k: v[i] for k, v in data.items()})
            for i in range(periods)
        ]

    def _stat(self, stat: dict, buckets: list[int], now: float) -> list:
        """The statistic in each period bucket (starting at `buckets[0]`, up to now)."""
        m = stat["Metric"]
        dims = {d["Name"]: d["Value"] for d in m.get("Dimensions", [])}
        by_bucket = bucketed(
            m["Namespace"], m["MetricName"], dims, buckets[0], now + 1, stat["Period"]
        )
        return [statistic(stat["Stat"], by_bucket.get(b, [])) for b in buckets]

    def evaluate(self, alarm: dict, now: float | None = None) -> str:
        """Set the alarm's state from its data (and notify on ALARM); the new state."""
        now = time.time() if now is None else now
        values = self.series(alarm, now)
        test, words = COMPARE[alarm["ComparisonOperator"]]
        threshold = alarm["Threshold"]
        missing = alarm.get("TreatMissingData", "missing")
        breaching = [v is not None and test(v, threshold) for v in values]
        if missing == "breaching":
            breaching = [b or v is None for b, v in zip(breaching, values, strict=True)]
        needed = alarm.get("DatapointsToAlarm") or alarm["EvaluationPeriods"]
        present = [v for v in values if v is not None]
        if sum(breaching) >= needed:
            state = "ALARM"
        elif not present and missing == "missing":
            state = "INSUFFICIENT_DATA"
        else:
            state = "OK"
        if state == alarm["StateValue"]:
            return state
        shown = ", ".join(f"{v:g}" for v in present) or "no datapoints"
        reason = (
            f"Threshold Crossed: {sum(breaching)} out of the last {len(values)} datapoints "
            f"[{shown}] {'was' if state == 'ALARM' else 'was not'} {words} the threshold "
            f"({threshold:g}) (minimum {needed} datapoint(s) for OK -> ALARM transition)."
        )
        cw = self.client("cloudwatch")
        cw.set_alarm_state(
            AlarmName=alarm["AlarmName"],
            StateValue=state,
            StateReason=reason[:1023],
            StateReasonData=json.dumps({"version": "1.0", "recentDatapoints": present}),
        )
        self.say("alarm", f"{alarm['AlarmName']} {alarm['StateValue']} -> {state}: {reason}")
        if state == "ALARM":
            self._notify(alarm, reason, now)
        return state

    def _notify(self, alarm: dict, reason: str, now: float) -> None:
        """CloudWatch's alarm message to each AlarmActions topic."""
        region = REGION_NAME.get(REGION, REGION)
        message = {
            "AlarmName": alarm["AlarmName"],
            "AlarmDescription": alarm.get("AlarmDescription"),
            "AWSAccountId": ACCOUNT,
            "NewStateValue": "ALARM",
            "NewStateReason": reason,
            "StateChangeTime": datetime.fromtimestamp(now, UTC).isoformat(),
            "Region": region,
            "AlarmArn": alarm["AlarmArn"],
            "OldStateValue": alarm["StateValue"],
            "AlarmActions": alarm.get("AlarmActions", []),
        }
        for topic in alarm.get("AlarmActions", []):
            if ":sns:" in topic:
                self.client("sns").publish(
                    TopicArn=topic,
                    Subject=f'ALARM: "{alarm["AlarmName"]}" in {region}'[:100],
                    Message=json.dumps(message),
                )

    def close(self) -> None:
        self.closed.set()


def publish_queue_metrics(client, last: dict[str, tuple]) -> None:
    """What SQS publishes for each queue (AWS/SQS, QueueName), from the local queues: a queue's
    figures when any is non-zero or they changed (an idle queue's zeros once, not forever, so
    the local CloudWatch does not grow without end)."""
    from moto.sqs.models import sqs_backends

    now = time.time()
    data = []
    for name, queue in list(sqs_backends[ACCOUNT][REGION].queues.items()):
        messages = list(queue._messages)
        delayed = sum(1 for m in messages if m.delayed)
        visible = sum(1 for m in messages if m.visible and not m.delayed)
        sent = [int(m.sent_timestamp) / 1000 for m in messages if not m.delayed]
        age = round(now - min(sent)) if sent else 0
        figures = (visible, delayed, age)
        if figures == last.get(name) and not any(figures):
            continue
        last[name] = figures
        dims = [{"Name": "QueueName", "Value": name}]
        for metric, value, unit in (
            ("ApproximateNumberOfMessagesVisible", visible, "Count"),
            ("ApproximateNumberOfMessagesDelayed", delayed, "Count"),
            ("ApproximateAgeOfOldestMessage", age, "Seconds"),
        ):
            data.append({"MetricName": metric, "Dimensions": dims, "Value": value, "Unit": unit})
    cw = client("cloudwatch")
    for i in range(0, len(data), 1000):  # PutMetricData: at most 1000 metrics a request
        cw.put_metric_data(Namespace="AWS/SQS", MetricData=data[i : i + 1000])


def datapoints(
    namespace: str, name: str, dims: dict[str, str], start: float, end: float
) -> list[tuple[float, float]]:
    """(epoch seconds, value) of one metric (exactly these dimensions) from the local
    CloudWatch's own store: moto's GetMetricStatistics groups periods from the first point, not
    on the boundaries CloudWatch uses, and computes no percentiles."""
    from moto.cloudwatch.models import cloudwatch_backends

    wanted = set(dims.items())
    out = []
    for d in list(cloudwatch_backends[ACCOUNT][REGION].metric_data):
        if d.namespace != namespace or d.name != name or not hasattr(d, "value"):
            continue
        if {(x.name, x.value) for x in d.dimensions} != wanted:
            continue
        stamp = d.timestamp
        at = (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()
        if start <= at <= end:
            out.append((at, float(d.value)))
    return sorted(out)


def bucketed(
    namespace: str, name: str, dims: dict[str, str], start: float, end: float, period: int
) -> dict[int, list[float]]:
    """The metric's values by period, keyed by each period's start (on period boundaries, as
    CloudWatch aggregates them)."""
    out: dict[int, list[float]] = {}
    for at, value in datapoints(namespace, name, dims, start, end):
        out.setdefault(int(at) // period * period, []).append(value)
    return out


def statistic(stat: str, values: list[float]) -> float | None:
    """CloudWatch's statistic of a period's values (None: no data): Sum, Maximum, Minimum,
    Average, SampleCount or a percentile pNN."""
    if not values:
        return None
    if stat.startswith("p"):
        ranked = sorted(values)
        return ranked[min(len(ranked) - 1, int(float(stat[1:]) / 100 * len(ranked)))]
    return {
        "Maximum": max,
        "Minimum": min,
        "Sum": sum,
        "SampleCount": len,
        "Average": lambda v: sum(v) / len(v),
    }[stat](values)
