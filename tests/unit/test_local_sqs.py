"""The local stack's fixes to moto's SQS (local/sluice_local/moto_fixes.py), each against moto
as it is: same answers, no lost message when requests run at once, counts in one pass."""

from __future__ import annotations

import threading

import boto3
import pytest
from moto import mock_aws

from sluice_local import moto_fixes


@pytest.fixture
def fixed(monkeypatch):
    """moto with the local stack's fixes, undone after the test."""
    for owner, name, value in moto_fixes.backend_patches():
        monkeypatch.setattr(owner, name, value, raising=False)


def deep_queue(n: int, received: int):
    """A queue `n` messages deep, `received` of them received (their receipt handles)."""
    from moto.sqs.models import Message, sqs_backends

    boto3.client("sqs", region_name="us-east-1").create_queue(QueueName="q")
    q = sqs_backends["123456789012"]["us-east-1"].queues["q"]
    for i in range(n):
        m = Message(f"id{i}", "x")
        m.mark_sent()
        if i < received:
            m.mark_received(600)
        q.add_message(m)
    return q, [m.receipt_handle for m in q._messages[:received]]


def deletes_and_sends_at_once(q, handles: list[str], sends: int) -> None:
    from moto.sqs.models import Message

    def send():
        for i in range(sends):
            m = Message(f"new{i}", "y")
            m.mark_sent()
            q.add_message(m)

    def delete(part):
        for h in part:
            q.delete_message(h)

    half = len(handles) // 2
    threads = [threading.Thread(target=send)]
    threads += [
        threading.Thread(target=delete, args=(p,)) for p in (handles[:half], handles[half:])
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_concurrent_deletes_and_sends_lose_no_message(fixed):
    """moto rebuilds the list on each delete: two deletes and a send at once dropped messages
    (500-1,200 of 3,000 sends here without the fix; 218 S3 notifications of 10,000 uploads in
    benchmarks.scale, silently)."""
    with mock_aws():
        q, handles = deep_queue(6000, 300)
        deletes_and_sends_at_once(q, handles, 3000)
        assert len(q._messages) == 6000 - 300 + 3000


def test_counts_and_retention_answer_as_moto_does(fixed):
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="c", Attributes={"MessageRetentionPeriod": "60"})[
            "QueueUrl"
        ]
        for i in range(5):
            sqs.send_message(QueueUrl=url, MessageBody=str(i), DelaySeconds=30 if i < 2 else 0)
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=60)
        sqs.send_message(QueueUrl=url, MessageBody="appended within the second")
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"]
        names.append("ApproximateNumberOfMessagesNotVisible")
        counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        assert counts == {names[0]: "3", names[1]: "2", names[2]: "1"}
        assert len(got["Messages"]) == 1
