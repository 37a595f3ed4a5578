"""Work that cannot start *yet*: an account quota reached, CreateTransformJob throttled.

Reporting such messages as batch item failures would count a receive each time, and after the
queue's maxReceiveCount (3) the uploads would sit in the DLQ although they only had to wait for a
running job to end. Instead the handler sends them back to the queue with a delay (SQS
DelaySeconds, growing per wait) and acknowledges the originals: a new message starts at receive
count 0, so waiting never counts towards the DLQ. Two message attributes carry how long the work
has waited; past the stack's limit (MAX_WAIT_HOURS) it is a failure like any other.

Only what waiting can mend waits. SageMaker's quota message says the quota and the request
(`The account-level service limit 'ml.g5.xlarge for transform job usage' is 2 Instances, with
current utilization of 2 Instances and a request delta of 1 Instances.`): a request larger than
the quota itself (a new account's 0 for a GPU type) never fits, and fails at once with a report
that names the quota to raise.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

# CreateTransformJob's answers that mean "not now": the quota (API reference: ResourceLimitExceeded)
# and the throttling errors every AWS API may answer (botocore's standard retry mode's list).
WAIT_CODES = {
    "ResourceLimitExceeded",
    "ThrottlingException",
    "Throttling",
    "ThrottledException",
    "RequestLimitExceeded",
    "TooManyRequestsException",
}
MAX_DELAY_S = 900  # SQS SendMessage DelaySeconds: 0 to 900 (API reference)
GROWTH_CAP = 4  # the delay doubles per wait up to 16x the first one (then MAX_DELAY_S caps it)
WAITS = "SluiceWaits"  # message attributes (names: alphanumerics, hyphens, underscores, periods)
SINCE = "SluiceWaitingSince"
_QUOTA = re.compile(
    r"service limit '(?P<quota>[^']+)' is (?P<limit>\d+) Instances?, with current utilization "
    r"of (?P<used>\d+) Instances? and a request delta of (?P<delta>\d+) Instances?"
)


@dataclass(frozen=True)
class Quota:
    """What SageMaker's ResourceLimitExceeded message says about the quota it hit."""

    name: str  # "ml.g5.xlarge for transform job usage" (its name in Service Quotas)
    limit: int
    used: int
    delta: int

    @property
    def never_fits(self) -> bool:
        return self.delta > self.limit


def quota(message: str) -> Quota | None:
    found = _QUOTA.search(message or "")
    if found is None:
        return None
    return Quota(found["quota"], int(found["limit"]), int(found["used"]), int(found["delta"]))


def why_waiting_cannot_help(code: str, message: str) -> str | None:
    """None if this CreateTransformJob error clears by waiting, else why it will not."""
    if code not in WAIT_CODES:
        return f"{code}: {message}"
    q = quota(message) if code == "ResourceLimitExceeded" else None
    if q is not None and q.never_fits:
        return (
            f"a job needs {q.delta} instance(s) but the account's quota "
            f"'{q.name}' is {q.limit}: waiting will not help. Ask for an increase in Service "
            "Quotas (SageMaker), or lower TransformInstanceCount / pick another "
            "TransformInstanceType."
        )
    return None


def delay_s(waits: int, first_s: int) -> int:
    """SQS DelaySeconds before the next try: doubling, capped, jittered so that waiting batches
    do not all come back at the same second."""
    full = min(MAX_DELAY_S, first_s * 2 ** min(waits, GROWTH_CAP))
    return max(1, round(full * random.uniform(0.8, 1.0)))


@dataclass(frozen=True)
class Waiting:
    """How long one message's work has waited so far (from its attributes)."""

    waits: int
    since: float

    @classmethod
    def of(cls, attributes: dict, now: float) -> Waiting:
        """From a Lambda SQS record's messageAttributes."""

        def value(name: str) -> str | None:  # Lambda's SQS record shape
            return (attributes.get(name) or {}).get("stringValue")

        try:
            return cls(int(value(WAITS) or 0), float(value(SINCE) or now))
        except ValueError:  # someone else's attribute of that name: start counting afresh
            return cls(0, now)

    def expired(self, now: float, max_wait_s: float) -> bool:
        return now - self.since > max_wait_s

    def next_attributes(self) -> dict:
        """The message attributes of the message sent back (SendMessage's shape)."""
        return {
            WAITS: {"DataType": "Number", "StringValue": str(self.waits + 1)},
            SINCE: {"DataType": "Number", "StringValue": f"{self.since:.3f}"},
        }


def resend_entries(items: list[tuple[str, Waiting]], first_s: int) -> list[dict]:
    """SendMessageBatch entries (Id = the index) for one invocation's waiting messages, each
    (its body: S3's notification, how long it has waited): the same bodies, counted, and one
    delay for all of them, from the longest wait among them, so that the batch comes back
    together and still makes one job. (Jittered per message, a burst of 40 uploads came back
    one by one over the delay's last fifth and made 18 jobs instead of one.)"""
    if not items:
        return []
    delay = delay_s(max(w.waits for _, w in items), first_s)
    return [
        {
            "Id": str(i),
            "MessageBody": body,
            "DelaySeconds": delay,
            "MessageAttributes": w.next_attributes(),
        }
        for i, (body, w) in enumerate(items)
    ]
