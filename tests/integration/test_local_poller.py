"""Lambda's SQS poller as the local stack plays it: batches run concurrently up to the event
source's MaximumConcurrency; past the function's reserved concurrency they are throttled, and
the throttled messages' receives count towards the DLQ (Lambda developer guide,
services-sqs-scaling). The template's relation (tests/unit/test_template.py) is what keeps
start-transform's uploads out of the DLQ here."""

from __future__ import annotations

import json
import os
import sys
import time

import boto3
import pytest
from moto import mock_aws

from sluice_local.deploy import EventSource, FunctionSpec
from sluice_local.events import Poller
from sluice_local.lambdas import Functions

REGION = "us-east-1"
HANDLER = """import json
import os
import time


def handler(event, context):
    time.sleep(0.05)  # a batch's work: long enough for batches to overlap
    with open(os.environ["RAN_FILE"], "a") as f:  # which records ran
        f.writelines(f"{json.loads(r['body'])['n']}\\n" for r in event["Records"])
    return {"batchItemFailures": []}
"""


def burst(tmp_path, monkeypatch, max_concurrency: int | None) -> dict:
    """40 messages through a poller to a function with reserved concurrency 2 (visibility
    timeout 2 s, maxReceiveCount 3): what ran, what was throttled, what reached the DLQ."""
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # Functions wraps them: restored after
    monkeypatch.setattr(sys, "stderr", sys.stderr)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("RAN_FILE", str(tmp_path / "ran.txt"))
    (tmp_path / "slow_handler.py").write_text(HANDLER)
    said: list[str] = []
    with mock_aws():
        clients = {s: boto3.client(s, region_name=REGION) for s in ("sqs", "cloudwatch")}
        sqs = clients["sqs"]
        dlq = sqs.create_queue(QueueName="work-dlq")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])
        redrive = {"deadLetterTargetArn": dlq_arn["Attributes"]["QueueArn"], "maxReceiveCount": 3}
        queue = sqs.create_queue(
            QueueName="work",
            Attributes={"VisibilityTimeout": "2", "RedrivePolicy": json.dumps(redrive)},
        )["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])
        for i in range(40):
            sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"n": i}))
        spec = FunctionSpec(
            "Fn", "fn", "slow_handler.handler", tmp_path, {}, 30, 128, reserved_concurrency=2
        )
        say = lambda kind, text: said.append(text)  # noqa: E731
        functions = Functions({"fn": spec}, dict(os.environ), tmp_path / "logs", say, clients.get)
        source = EventSource(
            "Uploads",
            arn["Attributes"]["QueueArn"],
            "fn",
            batch_size=1,
            report_failures=True,
            max_concurrency=max_concurrency,
        )
        poller = Poller(source, clients.get, functions, say)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            left = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
            if (
                left["ApproximateNumberOfMessages"]
                == left["ApproximateNumberOfMessagesNotVisible"]
                == "0"
            ):
                break
            time.sleep(0.5)
        poller.close()
        functions.close()
        dead: set[int] = set()
        while got := sqs.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10).get("Messages"):
            dead |= {json.loads(m["Body"])["n"] for m in got}
        ran_file = tmp_path / "ran.txt"
        ran = {int(n) for n in ran_file.read_text().split()} if ran_file.exists() else set()
        return {
            "ran": sum("<- SQS" in s and "throttled" not in s for s in said),
            "throttled": sum("throttled" in s for s in said),
            "dead": len(dead),
            "lost": set(range(40)) - ran - dead,
        }


@pytest.mark.slow  # ~8 s: three visibility timeouts of redelivery
def test_without_maximum_concurrency_a_burst_is_throttled_into_the_dlq(tmp_path, monkeypatch):
    got = burst(tmp_path, monkeypatch, max_concurrency=None)
    assert got["throttled"] > 0 and got["dead"] > 0, got
    # nothing lost: each ran, or is kept in the DLQ (or both: a message whose run outlived its
    # visibility timeout is received again, as Lambda's at-least-once delivery allows)
    assert got["lost"] == set(), got


def test_maximum_concurrency_at_the_reserved_concurrency_throttles_nothing(tmp_path, monkeypatch):
    got = burst(tmp_path, monkeypatch, max_concurrency=2)
    assert got == {"ran": 40, "throttled": 0, "dead": 0, "lost": set()}


@pytest.fixture(autouse=True)
def _fresh_handler_module():
    yield
    sys.modules.pop("slow_handler", None)
