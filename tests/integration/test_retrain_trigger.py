"""retrain_trigger with moto: debounced new data, the no-concurrent-retrain guard, nothing lost."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from tests.helpers import LambdaContext as Context
from tests.helpers import lambda_env

# every request checked against AWS's own rules (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("strict_aws")

REGION = "us-east-1"
ACCOUNT = "123456789012"
BUCKET = "sluice-dev-data"
TABLE = "retrain-triggers"


@pytest.fixture
def aws(monkeypatch):
    env = lambda_env(
        RETRAIN_TABLE=TABLE,
        RETRAIN_MIN_OBJECTS="10",
        RETRAIN_MIN_BYTES="1000000",
        RETRAIN_QUIET_SECONDS="600",
    )
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        from sluice_functions.aws import client

        client.cache_clear()
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        boto3.client("dynamodb", region_name=REGION).create_table(
            TableName=TABLE,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "trigger", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "trigger", "KeyType": "HASH"}],
        )
        sfn = boto3.client("stepfunctions", region_name=REGION)
        arn = sfn.create_state_machine(
            name="sluice-dev-retrain",
            roleArn=f"arn:aws:iam::{ACCOUNT}:role/r",
            definition=json.dumps({"StartAt": "P", "States": {"P": {"Type": "Pass", "End": True}}}),
        )["stateMachineArn"]
        monkeypatch.setenv("STATE_MACHINE_ARN", arn)
        clock = {"now": 1_800_000_000}
        from sluice_functions import retrain_trigger

        monkeypatch.setattr(retrain_trigger.time, "time", lambda: clock["now"])
        yield {"sfn": sfn, "arn": arn, "clock": clock, "rt": retrain_trigger}


def uploads(start: int, n: int, size: int = 1000, prefix: str = "training/") -> dict:
    """An SQS batch as Lambda delivers it: one S3 notification per message."""
    records = []
    for i in range(start, start + n):
        body = {
            "Records": [
                {
                    "eventName": "ObjectCreated:Put",
                    "eventSource": "aws:s3",
                    "s3": {
                        "bucket": {"name": BUCKET},
                        "object": {"key": f"{prefix}part-{i}.txt", "size": size, "eTag": f"e{i}"},
                    },
                }
            ]
        }
        records.append(
            {
                "messageId": f"m{i}",
                "receiptHandle": "r",
                "body": json.dumps(body),
                "attributes": {"ApproximateReceiveCount": "1"},
                "messageAttributes": {},
                "eventSource": "aws:sqs",
                "awsRegion": REGION,
                "eventSourceARN": f"arn:aws:sqs:{REGION}:{ACCOUNT}:training",
            }
        )
    return {"Records": records}


def executions(aws) -> list[dict]:
    return aws["sfn"].list_executions(stateMachineArn=aws["arn"])["executions"]


def execution_input(aws, ex: dict) -> dict:
    return json.loads(aws["sfn"].describe_execution(executionArn=ex["executionArn"])["input"])


def test_a_bulk_upload_starts_one_retrain(aws):
    rt = aws["rt"]
    assert rt.on_uploads(uploads(0, 4), Context())["outcome"] == "waiting"
    assert executions(aws) == []
    aws["clock"]["now"] += 30
    out = rt.on_uploads(uploads(4, 8), Context())  # 12 new objects >= 10
    assert out["outcome"] == "started" and "12 new objects" in out["why"]
    # the rest of the bulk upload arrives while the first retrain runs: recorded, deferred
    for start in range(12, 500, 100):
        assert rt.on_uploads(uploads(start, 100), Context())["outcome"] == "deferred"
    [ex] = executions(aws)
    assert ex["name"] == "new-data-20270115T080000Z"
    doc = execution_input(aws, ex)
    assert doc["reason"] == "new-data" and doc["newObjects"] == 12
    assert doc["trainingData"] == f"s3://{BUCKET}/training/" and "validationData" not in doc


def test_a_trigger_during_a_retrain_is_started_after_it(aws):
    rt = aws["rt"]
    rt.on_uploads(uploads(0, 10), Context())
    [first] = executions(aws)
    aws["clock"]["now"] += 60
    assert (
        rt.on_command({"action": "manual", "hyperparameters": {"max_steps": 100}}, Context())[
            "outcome"
        ]
        == "deferred"
    )
    aws["clock"]["now"] += 300
    assert rt.on_command({"action": "sweep"}, Context())["outcome"] == "deferred"
    aws["sfn"].stop_execution(executionArn=first["executionArn"])
    out = rt.on_command({"action": "sweep"}, Context())
    assert out["outcome"] == "started" and out["execution"].startswith("manual-")
    second = next(e for e in executions(aws) if e["name"] == out["execution"])
    doc = execution_input(aws, second)
    assert doc["reason"] == "manual" and doc["hyperparameters"] == {"max_steps": "100"}
    assert rt.on_command({"action": "sweep"}, Context())["outcome"] == "idle"


def test_a_few_files_start_a_retrain_once_uploads_go_quiet(aws):
    rt = aws["rt"]
    boto3.client("s3", region_name=REGION).put_object(
        Bucket=BUCKET, Key="validation/held-out.txt", Body=b"held out\n"
    )
    rt.on_uploads(uploads(0, 2), Context())
    aws["clock"]["now"] += 599
    assert rt.on_command({"action": "sweep"}, Context())["outcome"] == "waiting"
    aws["clock"]["now"] += 1
    out = rt.on_command({"action": "sweep"}, Context())
    assert out["outcome"] == "started" and "quiet for 600 s" in out["why"]
    [ex] = executions(aws)
    assert execution_input(aws, ex)["validationData"] == f"s3://{BUCKET}/validation/"


def test_a_window_starts_one_execution_even_if_started_twice(aws, monkeypatch):
    """A crash after StartExecution, before the record is cleared: the retry reuses the name."""
    from sluice_functions import retrain_trigger

    rt = aws["rt"]
    consume = retrain_trigger.consume

    def crash(*args, **kwargs):
        raise RuntimeError("function timed out")

    monkeypatch.setattr(retrain_trigger, "consume", crash)
    with pytest.raises(RuntimeError):
        rt.on_command({"action": "schedule"}, Context())
    [ex] = executions(aws)
    aws["sfn"].stop_execution(executionArn=ex["executionArn"])  # not running: the guard passes
    monkeypatch.setattr(retrain_trigger, "consume", consume)
    out = rt.on_command({"action": "sweep"}, Context())
    assert out["outcome"] == "started" and out["execution"] == ex["name"]
    assert len(executions(aws)) == 1
    assert rt.on_command({"action": "sweep"}, Context())["outcome"] == "idle"


def test_malformed_and_irrelevant_messages_are_acknowledged(aws):
    rt = aws["rt"]
    bad = uploads(0, 1)
    bad["Records"][0]["body"] = "not json"
    assert rt.on_uploads(bad, Context())["outcome"] == "idle"
    assert rt.on_uploads(uploads(0, 3, prefix="incoming/"), Context())["outcome"] == "idle"
    assert rt.on_monitoring({"detail-type": "something else"}, Context())["outcome"] == "ignored"
    # a direct invocation that is no command: said why, acknowledged, not retried
    invalid = [
        ({"action": "retrain-now"}, "expected"),
        ({"Records": []}, "expected"),
        ({"action": "manual", "hyperparameters": [1]}, "hyperparameters"),
    ]
    for command, why in invalid:
        out = rt.on_command(command, Context())
        assert out["outcome"] == "ignored" and why in out["error"]
    assert executions(aws) == []


VIOLATIONS = {
    "violations": [
        {
            "feature_name": "token_distribution",
            "constraint_check_type": "baseline_drift_check",
            "description": "distance: 0.41 exceeds threshold: 0.1",
        },
        {
            "feature_name": "script_mix",
            "constraint_check_type": "baseline_drift_check",
            "description": "distance: 0.93 exceeds threshold: 0.2",
        },
    ]
}


def monitor_event(job: str, status: str = "Completed", **detail) -> dict:
    """EventBridge's `SageMaker Processing Job State Change` for a monitor job."""
    return {
        "source": "aws.sagemaker",
        "detail-type": "SageMaker Processing Job State Change",
        "detail": {
            "ProcessingJobName": job,
            "ProcessingJobStatus": status,
            "ProcessingOutputConfig": {
                "Outputs": [
                    {
                        "OutputName": "monitoring",
                        "S3Output": {
                            "S3Uri": f"s3://{BUCKET}/monitoring/{job}/output",
                            "LocalPath": "/opt/ml/processing/output",
                            "S3UploadMode": "EndOfJob",
                        },
                    }
                ]
            },
            **detail,
        },
    }


@pytest.fixture
def topic(aws, monkeypatch):
    sns = boto3.client("sns", region_name=REGION)
    sqs = boto3.client("sqs", region_name=REGION)
    arn = sns.create_topic(Name="notifications")["TopicArn"]
    url = sqs.create_queue(QueueName="notes")["QueueUrl"]
    qarn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(
        TopicArn=arn, Protocol="sqs", Endpoint=qarn, Attributes={"RawMessageDelivery": "true"}
    )
    monkeypatch.setenv("TOPIC_ARN", arn)

    def read() -> list[dict]:
        msgs = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        return [json.loads(m["Body"]) for m in msgs]

    return read


def put_output(job: str, body: bytes) -> None:
    boto3.client("s3", region_name=REGION).put_object(
        Bucket=BUCKET, Key=f"monitoring/{job}/output/constraint_violations.json", Body=body
    )


def test_drift_starts_one_retrain_with_its_violations(aws, topic):
    rt = aws["rt"]
    put_output("sluice-dev-monitor-1", json.dumps(VIOLATIONS).encode())
    out = rt.on_monitoring(monitor_event("sluice-dev-monitor-1"), Context())
    assert out["outcome"] == "drift" and out["retrain"]["outcome"] == "started"
    [ex] = executions(aws)
    doc = execution_input(aws, ex)
    assert ex["name"].startswith("drift-") and doc["reason"] == "drift"
    assert [v["feature_name"] for v in doc["violations"]] == ["token_distribution", "script_mix"]
    # the next window reports drift again while that retrain runs: no second execution
    put_output("sluice-dev-monitor-2", json.dumps(VIOLATIONS).encode())
    aws["clock"]["now"] += 3600
    again = rt.on_monitoring(monitor_event("sluice-dev-monitor-2"), Context())
    assert again["retrain"]["outcome"] == "deferred"
    assert len(executions(aws)) == 1
    notes = topic()
    assert [n["outcome"] for n in notes] == ["drift", "drift"]


def test_no_violations_start_nothing(aws, topic):
    put_output("sluice-dev-monitor-1", b'{"violations": []}')
    out = aws["rt"].on_monitoring(monitor_event("sluice-dev-monitor-1"), Context())
    assert out["outcome"] == "no-drift"
    assert executions(aws) == [] and topic() == []


@pytest.mark.parametrize(
    "body, status, expected",
    [
        (None, "Completed", "cannot read"),
        (b"{not json", "Completed", "malformed"),
        (b'{"violations": [{"description": "x"}]}', "Completed", "malformed"),
        (json.dumps(VIOLATIONS).encode(), "Failed", "job Failed"),
    ],
    # named: pytest's own ids for bytes differ between releases (tests/inventory.txt keeps ids)
    ids=["unreadable", "not-json", "no-feature-name", "violations-of-a-failed-job"],
)
def test_broken_monitor_outputs_are_a_monitoring_failure_not_drift(
    aws, topic, body, status, expected
):
    if body is not None:
        put_output("sluice-dev-monitor-1", body)
    out = aws["rt"].on_monitoring(
        monitor_event("sluice-dev-monitor-1", status, FailureReason="ClientError: no capture"),
        Context(),
    )
    assert out["outcome"] == "monitoring-failed" and expected in out["reason"]
    assert executions(aws) == []
    [note] = topic()
    assert note["outcome"] == "monitoring-failed"


# --- at-least-once and repeated deliveries (SQS and SageMaker both may deliver twice) ----------


def test_one_object_delivered_ten_times_counts_once(aws):
    rt = aws["rt"]
    for _ in range(10):  # min objects is 10: counted per message, this started a retrain
        out = rt.on_uploads(uploads(0, 1), Context())
        assert out["outcome"] == "waiting" and out["batchItemFailures"] == []
    assert executions(aws) == []
    assert rt.load(TABLE).objects == 1
    # a new version of the same key is new data
    batch = uploads(0, 1)
    body = json.loads(batch["Records"][0]["body"])
    body["Records"][0]["s3"]["object"]["versionId"] = "v2"
    batch["Records"][0]["body"] = json.dumps(body)
    rt.on_uploads(batch, Context())
    assert rt.load(TABLE).objects == 2


def test_uploads_that_could_not_be_recorded_are_retried_alone(aws, monkeypatch):
    rt = aws["rt"]
    add = rt.add

    def flaky(table, reason, *args, once=None, **kw):
        if once and "part-1.txt" in once:
            raise ClientError({"Error": {"Code": "ProvisionedThroughputExceededException"}}, "T")
        return add(table, reason, *args, once=once, **kw)

    monkeypatch.setattr(rt, "add", flaky)
    out = rt.on_uploads(uploads(0, 3), Context())
    assert out["batchItemFailures"] == [{"itemIdentifier": "m1"}]
    assert rt.load(TABLE).objects == 2


def test_a_repeated_drift_event_queues_no_second_retrain(aws, topic):
    rt = aws["rt"]
    put_output("sluice-dev-monitor-1", json.dumps(VIOLATIONS).encode())
    event = monitor_event(
        "sluice-dev-monitor-1",
        ProcessingJobArn=f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:processing-job/sluice-dev-monitor-1",
    )
    assert rt.on_monitoring(event, Context())["retrain"]["outcome"] == "started"
    [first] = executions(aws)
    aws["sfn"].stop_execution(executionArn=first["executionArn"])  # the retrain has ended
    aws["clock"]["now"] += 600
    again = rt.on_monitoring(event, Context())  # SageMaker delivers the same change again
    assert again["outcome"] == "repeated"
    assert rt.on_command({"action": "sweep"}, Context())["outcome"] == "idle"
    assert len(executions(aws)) == 1
    assert [n["outcome"] for n in topic()] == ["drift"]  # notified once


def test_a_repeated_monitoring_failure_is_reported_once(aws, topic):
    rt = aws["rt"]
    event = monitor_event("sluice-dev-monitor-1", "Failed", FailureReason="ClientError: x")
    assert rt.on_monitoring(event, Context())["outcome"] == "monitoring-failed"
    assert rt.on_monitoring(event, Context())["outcome"] == "repeated"
    assert len(topic()) == 1
