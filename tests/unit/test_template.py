"""Invariants of template.yaml that the linters do not know about."""

from pathlib import Path

import pytest
from cfnlint.decode import cfn_yaml

T = cfn_yaml.load(str(Path(__file__).resolve().parents[2] / "template.yaml"))
R = T["Resources"]


def test_queue_visibility_is_at_least_six_function_timeouts():
    timeout = R["StartTransformFunction"]["Properties"]["Timeout"]
    assert R["IncomingQueue"]["Properties"]["VisibilityTimeout"] >= 6 * timeout
    redrive = R["IncomingQueue"]["Properties"]["RedrivePolicy"]
    assert 1 < redrive["maxReceiveCount"] <= 5


def test_sqs_event_source_reports_partial_failures_with_a_window():
    event = R["StartTransformFunction"]["Properties"]["Events"]["Uploads"]["Properties"]
    assert event["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert event["MaximumBatchingWindowInSeconds"] == {"Ref": "BatchingWindowSeconds"}


@pytest.mark.parametrize("name", [n for n, r in R.items() if r["Type"] == "AWS::SQS::Queue"])
def test_every_queue_is_encrypted_with_the_key(name):
    assert R[name]["Properties"]["KmsMasterKeyId"] == {"Ref": "DataKey"}


def test_data_bucket_is_kms_encrypted_versioned_private_and_triggers_on_incoming_only():
    p = R["DataBucket"]["Properties"]
    rule = p["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    assert rule["BucketKeyEnabled"] is True
    assert p["VersioningConfiguration"]["Status"] == "Enabled"
    assert all(p["PublicAccessBlockConfiguration"].values())
    (notification,) = p["NotificationConfiguration"]["QueueConfigurations"]
    assert notification["Filter"]["S3Key"]["Rules"] == [{"Name": "prefix", "Value": "incoming/"}]


def test_pass_role_is_limited_to_sagemaker():
    statements = R["StartTransformFunction"]["Properties"]["Policies"][0]["Statement"]
    (passrole,) = [s for s in statements if s["Action"] == "iam:PassRole"]
    assert passrole["Condition"] == {
        "StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}
    }


def test_outputs_name_what_operators_need():
    assert {"DataBucketName", "IncomingQueueUrl", "CurrentModelParameterName",
            "NotificationTopicArn"} <= set(T["Outputs"])  # fmt: skip
