"""The handlers fed AWS's own documented sample events, verbatim (tests/events/README.md names
the document each comes from). An S3 notification reaches a function inside an SQS message's
`body`, as S3 delivers it to a queue."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from sluice_functions.batching import Parsed, Settings, parse_message
from sluice_functions.reports import duration_s
from tests.helpers import REPO, lambda_env
from tests.helpers import LambdaContext as Context

EVENTS = REPO / "tests" / "events"
REGION = "us-east-1"
ACCOUNT = "123456789012"

pytestmark = pytest.mark.usefixtures("strict_aws")


def sample(name: str) -> dict:
    return json.loads((EVENTS / name).read_text())


def sqs_carrying(*messages: dict) -> dict:
    """Lambda's documented SQS event, its records' bodies replaced by S3's documented messages."""
    event = sample("sqs-message-event.json")
    event["Records"] = event["Records"][: len(messages)]
    for record, message in zip(event["Records"], messages, strict=True):
        record["body"] = json.dumps(message)
    return event


def test_the_documented_s3_messages_parse_as_s3_sends_them():
    settings = Settings(stage="dev", bucket="mybucket", incoming_prefix="", suffixes=(".jpg",))
    parsed = Parsed()
    parse_message("m1", json.dumps(sample("s3-object-created-put.json")), settings, parsed)
    parse_message("m2", json.dumps(sample("s3-test-event.json")), settings, parsed)
    [up] = parsed.uploads
    assert (up.bucket, up.key, up.size, up.etag) == (
        "mybucket",
        "HappyFace.jpg",
        1024,
        "d41d8cd98f00b204e9800998ecf8427e",
    )
    assert up.version_id == "096fKKXTRTtl3on89fVO.nfljtsv6qko"
    assert up.sequencer == "0055AED6DCD90281E5"
    assert up.identity == "mybucket/HappyFace.jpg@096fKKXTRTtl3on89fVO.nfljtsv6qko"
    assert not parsed.malformed  # the test event is skipped, not malformed
    assert [s.message_id for s in parsed.skipped] == ["m2"]


@pytest.fixture
def aws(monkeypatch):
    env = lambda_env(
        RETRAIN_TABLE="retrain-triggers",
        CLAIMS_TABLE="claims",
        MODEL_PARAMETER="/sluice/dev/current-model",
        STATE_MACHINE_ARN=f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:sluice-dev-retrain",
    )
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        from sluice_functions.aws import client

        client.cache_clear()
        ddb = boto3.client("dynamodb", region_name=REGION)
        for table, key in (("retrain-triggers", "trigger"), ("claims", "object")):
            ddb.create_table(
                TableName=table,
                BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
                KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
            )
        yield


def test_start_transform_acknowledges_the_test_event_and_a_foreign_object(aws, caplog):
    from sluice_functions import start_transform

    event = sqs_carrying(sample("s3-test-event.json"), sample("s3-object-created-put.json"))
    assert start_transform.handler(event, Context()) == {"batchItemFailures": []}
    # each skipped with its reason (the log record's structured fields, as CloudWatch gets them)
    skipped = {getattr(r, "key", None): getattr(r, "reason", "") for r in caplog.records}
    assert "outside incoming/" in skipped["HappyFace.jpg"]


def test_retrain_on_uploads_acknowledges_the_documented_samples(aws):
    from sluice_functions import retrain_trigger

    event = sqs_carrying(sample("s3-test-event.json"), sample("s3-object-created-put.json"))
    out = retrain_trigger.on_uploads(event, Context())
    assert out["batchItemFailures"] == [] and out["outcome"] == "idle"


def test_transform_finished_takes_the_documented_transform_event(aws):
    from sluice_functions import transform_finished

    event = sample("sagemaker-transform-job-state-change.json")
    # its status is a placeholder ("another status... GO"): not final, so nothing is reported
    out = transform_finished.handler(event, Context())
    assert out["action"] == "ignored"
    # its times are ISO-8601, not epoch milliseconds: the duration still comes out
    assert duration_s(event["detail"]) == 0.0


def test_a_documented_event_of_another_kind_is_acknowledged_not_retried(aws):
    """Both EventBridge-fed functions take an endpoint state change (no rule sends them one, but
    a widened rule must not make them fail and retry): each says it ignored it."""
    from sluice_functions import retrain_trigger, transform_finished

    event = sample("sagemaker-endpoint-state-change.json")
    assert retrain_trigger.on_monitoring(event, Context())["outcome"] == "ignored"
    assert transform_finished.handler(event, Context())["action"] == "ignored"
