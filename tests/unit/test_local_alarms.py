"""The local CloudWatch's alarms (sluice_local.alarms): template.yaml's paging alarms, put as
the deployer puts them, go to ALARM on the data that should page and notify the topic with
CloudWatch's message; no data pages no one."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import boto3
import pytest
from moto import mock_aws

from sluice_local.alarms import Alarms, evaluate
from tests.unit.test_ops_view import ALARMS, ROLLBACK, R, sub

REGION = "us-east-1"


def resolved(value):
    """Properties with every intrinsic function resolved as for Stage dev."""
    if isinstance(value, list):
        return [resolved(v) for v in value]
    if isinstance(value, dict):
        if set(value) & {"Fn::Sub", "Fn::GetAtt", "Ref"}:
            return topic_arn() if value == {"Ref": "NotificationTopic"} else sub(value)
        return {k: resolved(v) for k, v in value.items()}
    return value


def topic_arn() -> str:
    return f"arn:aws:sns:{REGION}:123456789012:notifications"


@pytest.fixture
def cloud():
    with mock_aws():
        clients = {s: boto3.client(s, region_name=REGION) for s in ("cloudwatch", "sns", "sqs")}
        clients["sns"].create_topic(Name="notifications")
        inbox = clients["sqs"].create_queue(QueueName="inbox")["QueueUrl"]
        arn = clients["sqs"].get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])
        clients["sns"].subscribe(
            TopicArn=topic_arn(), Protocol="sqs", Endpoint=arn["Attributes"]["QueueArn"]
        )
        for name in set(ALARMS) - ROLLBACK:  # (those read a parameter; SageMaker reads them)
            p = resolved(R[name]["Properties"])
            p.pop("AlarmName")
            clients["cloudwatch"].put_metric_alarm(AlarmName=name, **p)
        clients["inbox"] = inbox
        yield clients


def put(cloud, namespace: str, metric: str, dims: dict, value: float, ago_s: float = 0) -> None:
    cloud["cloudwatch"].put_metric_data(
        Namespace=namespace,
        MetricData=[
            {
                "MetricName": metric,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                "Value": value,
                "Timestamp": datetime.fromtimestamp(time.time() - ago_s, UTC),
            }
        ],
    )


def state(cloud, name: str) -> str:
    alarms = Alarms(lambda s: cloud[s], lambda *a: None, start=False)
    [alarm] = cloud["cloudwatch"].describe_alarms(AlarmNames=[name])["MetricAlarms"]
    return alarms.evaluate(alarm)


MACHINE = sub({"Ref": "RetrainStateMachine"})
TRIGGERS = {
    "DeadLetterMessagesAlarm": (
        "AWS/SQS",
        "ApproximateNumberOfMessagesVisible",
        {"QueueName": "sluice-dev-training-dlq"},
        1,
    ),
    "TransformJobsFailedAlarm": (
        "Sluice",
        "JobsFailed",
        {"service": "sluice-transform-finished"},
        1,
    ),
    "BatchesGivenUpAlarm": ("Sluice", "WaitsGivenUp", {"service": "sluice-start-transform"}, 1),
    "RetrainFailedAlarm": ("AWS/States", "ExecutionsAborted", {"StateMachineArn": MACHINE}, 1),
    "FunctionErrorsAlarm": (
        "AWS/Lambda",
        "Errors",
        {"FunctionName": "sluice-dev-start-monitor"},
        1,
    ),
    "FunctionThrottlesAlarm": (
        "AWS/Lambda",
        "Throttles",
        {"FunctionName": "sluice-dev-start-transform"},
        2,
    ),
    "DriftAlarm": ("Sluice", "DriftViolations", {"service": "sluice-retrain-trigger"}, 3),
    "MonitoringFailuresAlarm": (
        "Sluice",
        "MonitoringFailures",
        {"service": "sluice-retrain-trigger"},
        1,
    ),
}


def test_every_paging_alarm_has_a_trigger_here():
    assert set(TRIGGERS) | {"StuckQueueAlarm"} == set(ALARMS) - ROLLBACK


@pytest.mark.parametrize("name", sorted(TRIGGERS))
def test_the_data_that_should_page_pages_and_no_data_does_not(cloud, name):
    assert state(cloud, name) == "OK"  # nothing happened: missing data is not breaching
    namespace, metric, dims, value = TRIGGERS[name]
    put(cloud, namespace, metric, dims, value)
    assert state(cloud, name) == "ALARM"
    got = cloud["sqs"].receive_message(QueueUrl=cloud["inbox"], MaxNumberOfMessages=10)
    [note] = [json.loads(m["Body"]) for m in got["Messages"]]
    assert note["Subject"] == f'ALARM: "{name}" in US East (N. Virginia)'
    message = json.loads(note["Message"])
    assert message["NewStateValue"] == "ALARM" and message["OldStateValue"] == "OK"
    assert message["AlarmDescription"] == R[name]["Properties"]["AlarmDescription"]


def test_a_stuck_queue_pages_after_two_periods_not_one(cloud):
    dims = {"QueueName": "sluice-dev-incoming"}
    put(cloud, "AWS/SQS", "ApproximateAgeOfOldestMessage", dims, 1900)
    assert state(cloud, "StuckQueueAlarm") == "OK"  # one period over 30 minutes is not stuck
    put(cloud, "AWS/SQS", "ApproximateAgeOfOldestMessage", dims, 1700, ago_s=300)
    assert state(cloud, "StuckQueueAlarm") == "OK"
    put(cloud, "AWS/SQS", "ApproximateAgeOfOldestMessage", dims, 2100, ago_s=300)
    assert state(cloud, "StuckQueueAlarm") == "ALARM"


def test_metric_math_as_cloudwatch_reads_it():
    assert evaluate("MAX([q0, q1])", {"q0": None, "q1": 2.0}) == 2.0
    assert evaluate("FILL(g0, 0) + FILL(g1, 0)", {"g0": None, "g1": 1.0}) == 1.0
    assert evaluate("SUM([l0, l1])", {"l0": None, "l1": None}) is None
    assert evaluate("g0 + g1", {"g0": None, "g1": 1.0}) is None
    with pytest.raises(ValueError):
        evaluate("__import__('os')", {})
