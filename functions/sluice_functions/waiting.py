"""Work that cannot start *yet*: an account quota reached, CreateTransformJob throttled, or a
job SageMaker created but could not find instances for (`CapacityError`).

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

A job that was created and then failed because SageMaker could not provision its instances is
waiting too: its FailureReason begins with `CapacityError` (AWS Batch User Guide, "Jobs stuck
in RUNNABLE due to capacity", for SageMaker jobs; the SageMaker Python SDK raises its
CapacityError on the same prefix). transform_finished sends its uploads back to the queue the
same way, and start_transform does not count such a job as one of a batch's failed attempts.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from botocore.exceptions import ClientError

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


CAPACITY_ERROR = "CapacityError"


def is_capacity_failure(reason: str | None) -> bool:
    """A job's FailureReason that says SageMaker found no instances for it: waiting may mend it
    ("CapacityError: Unable to provision requested ML compute capacity. Please retry using a
    different ML instance type.")."""
    return (reason or "").lstrip().startswith(CAPACITY_ERROR)


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

    @classmethod
    def of_all(cls, states: list[Waiting], now: float) -> Waiting:
        """A job's: the most waits and the longest wait of its uploads' messages."""
        if not states:
            return cls(0, now)
        return cls(max(w.waits for w in states), min(w.since for w in states))

    def record(self) -> dict:
        """In a job's uploads file (batching.uploads_key), read back by `from_record`."""
        return {"waits": self.waits, "waiting_since": round(self.since, 3)}

    @classmethod
    def from_record(cls, doc: dict, now: float) -> Waiting:
        return cls(int(doc.get("waits", 0)), float(doc.get("waiting_since", now)))

    def expired(self, now: float, max_wait_s: float) -> bool:
        return now - self.since > max_wait_s

    def next_attributes(self) -> dict:
        """The message attributes of the message sent back (SendMessage's shape)."""
        return {
            WAITS: {"DataType": "Number", "StringValue": str(self.waits + 1)},
            SINCE: {"DataType": "Number", "StringValue": f"{self.since:.3f}"},
        }


def send_back(sqs, queue_url: str, entries: list[dict]) -> dict[str, str]:
    """SendMessageBatch the entries (resend_entries) 10 at a time; {Id: why} of those not sent."""
    failed: dict[str, str] = {}
    for start in range(0, len(entries), 10):  # SendMessageBatch: at most 10 entries
        chunk = entries[start : start + 10]
        try:
            answer = sqs.send_message_batch(QueueUrl=queue_url, Entries=chunk)
        except ClientError as e:
            failed |= {entry["Id"]: str(e) for entry in chunk}
            continue
        failed |= {bad["Id"]: bad.get("Message", bad["Code"]) for bad in answer.get("Failed", [])}
    return failed


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
