"""sluice_local.validation: the rules AWS checks on its side, read from botocore's models."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from sluice_local.validation import check, problems, strict_clients

JOB = {
    "TransformJobName": "sluice-dev-1",
    "ModelName": "m",
    "TransformInput": {
        "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/i/"}}
    },
    "TransformOutput": {"S3OutputPath": "s3://b/o/"},
    "TransformResources": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1},
}


def job(**changes) -> dict:
    return {**JOB, **changes}


def test_a_valid_request_has_no_problems():
    assert problems("sagemaker", "CreateTransformJob", JOB) == []


def test_a_comma_in_a_tag_value_is_refused_as_sagemaker_refuses_it():
    found = problems(
        "sagemaker", "CreateTransformJob", job(Tags=[{"Key": "k", "Value": "a.txt,b.txt"}])
    )
    assert len(found) == 1
    assert "'tags.1.member.value'" in found[0] and "regular expression pattern" in found[0]
    assert r"\p{L}" in found[0]
    # letters of any script, spaces and the allowed punctuation pass (\p{L}, \p{Z}, \p{N})
    fine = [{"Key": "k", "Value": "straße 数据 s3://b/k=v+1@x"}]
    assert problems("sagemaker", "CreateTransformJob", job(Tags=fine)) == []


def test_a_64_character_job_name_is_refused():
    found = problems("sagemaker", "CreateTransformJob", job(TransformJobName="a" * 64))
    assert any("length less than or equal to 63" in f for f in found), found
    assert problems("sagemaker", "CreateTransformJob", job(TransformJobName="a" * 63)) == []
    assert problems("sagemaker", "CreateTransformJob", job(TransformJobName="-a"))


def test_out_of_range_numbers_and_unknown_enums_are_refused():
    res = {"InstanceType": "ml.g5.xlarge", "InstanceCount": 0}
    found = problems("sagemaker", "CreateTransformJob", job(TransformResources=res))
    assert any("greater than or equal to 1" in f for f in found), found
    client_config = {"InvocationsTimeoutInSeconds": 3601, "InvocationsMaxRetries": 4}
    found = problems("sagemaker", "CreateTransformJob", job(ModelClientConfig=client_config))
    assert len(found) == 2, found
    found = problems("sagemaker", "CreateTransformJob", job(BatchStrategy="Lines"))
    assert "enum value set: [MultiRecord, SingleRecord]" in found[0]


def test_list_and_map_sizes_are_checked():
    tags = [{"Key": f"k{i}", "Value": "v"} for i in range(51)]
    assert problems("sagemaker", "CreateTransformJob", job(Tags=tags))
    env = {f"K{i}": "v" for i in range(17)}
    assert problems("sagemaker", "CreateTransformJob", job(Environment=env))


def test_check_answers_as_aws_does():
    with pytest.raises(ClientError) as e:
        check("sagemaker", "CreateTransformJob", job(TransformJobName="a" * 64))
    assert e.value.response["Error"]["Code"] == "ValidationException"
    # a 64-character name breaks both the length and the pattern ({0,62} after the first)
    assert e.value.response["Error"]["Message"].startswith("2 validation errors detected: ")


def test_strict_clients_refuse_before_sending_and_remember(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    bad = job(Tags=[{"Key": "sluice:sources", "Value": "a.txt,b.txt"}])
    with mock_aws(), strict_clients() as seen:
        sm = boto3.client("sagemaker")
        with pytest.raises(ClientError) as e:
            sm.create_transform_job(**bad)
        assert e.value.response["Error"]["Code"] == "ValidationException"
    assert [(s, op) for s, op, _ in seen] == [("sagemaker", "CreateTransformJob")]
    with mock_aws():  # outside the block clients are as botocore made them: moto takes it
        boto3.client("sagemaker").create_transform_job(**bad)
