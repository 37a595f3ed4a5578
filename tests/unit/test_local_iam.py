"""Local IAM's policy simulator (sluice_local.iam_simulation): the verdicts IAM's
SimulatePrincipalPolicy gives for identity policies, through boto3 against moto."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

TRUST = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Allow",
            "Principal": {"Service": "sagemaker.amazonaws.com"},
            "Action": "sts:AssumeRole",
        }
    ],
}
INLINE = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": "ecr:GetAuthorizationToken", "Resource": "*"},
        {
            "Effect": "Allow",
            "Action": "cloudwatch:PutMetricData",
            "Resource": "*",
            "Condition": {"StringLike": {"cloudwatch:namespace": ["/aws/sagemaker/*"]}},
        },
        {"Effect": "Deny", "Action": "s3:*", "Resource": "arn:aws:s3:::secret/*"},
    ],
}
MANAGED = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "S3:Get*", "Resource": "*"}],
}


@pytest.fixture
def iam(monkeypatch):
    from sluice_local.moto_fixes import backend_patches

    for owner, name, value in backend_patches():
        monkeypatch.setattr(owner, name, value, raising=False)
    with mock_aws():
        client = boto3.client("iam", region_name="us-east-1")
        client.create_role(RoleName="r", AssumeRolePolicyDocument=json.dumps(TRUST))
        client.put_role_policy(RoleName="r", PolicyName="inline", PolicyDocument=json.dumps(INLINE))
        arn = client.create_policy(PolicyName="managed", PolicyDocument=json.dumps(MANAGED))
        client.attach_role_policy(RoleName="r", PolicyArn=arn["Policy"]["Arn"])
        yield client


def verdicts(iam, actions, **kw) -> dict[str, dict]:
    arn = iam.get_role(RoleName="r")["Role"]["Arn"]
    found = iam.simulate_principal_policy(PolicySourceArn=arn, ActionNames=actions, **kw)
    return {e["EvalActionName"]: e for e in found["EvaluationResults"]}


def test_allow_implicit_deny_and_missing_context(iam):
    got = verdicts(
        iam,
        [
            "ecr:GetAuthorizationToken",
            "cloudwatch:PutMetricData",
            "ec2:DescribeVpcs",
            "s3:GetObject",
        ],
    )
    assert got["ecr:GetAuthorizationToken"]["EvalDecision"] == "allowed"
    assert got["ecr:GetAuthorizationToken"]["MatchedStatements"][0]["SourcePolicyId"] == "inline"
    # a condition the request gives no context for: the statement does not apply
    assert got["cloudwatch:PutMetricData"]["EvalDecision"] == "implicitDeny"
    assert got["cloudwatch:PutMetricData"]["MissingContextValues"] == ["cloudwatch:namespace"]
    assert got["ec2:DescribeVpcs"]["EvalDecision"] == "implicitDeny"
    # an attached managed policy counts; actions match case-insensitively
    assert got["s3:GetObject"]["EvalDecision"] == "allowed"
    assert got["s3:GetObject"]["MatchedStatements"][0]["SourcePolicyId"] == "managed"


def test_context_and_resources_and_explicit_deny(iam):
    got = verdicts(
        iam,
        ["s3:GetObject", "cloudwatch:PutMetricData"],
        ResourceArns=["arn:aws:s3:::secret/key"],
        ContextEntries=[
            {
                "ContextKeyName": "cloudwatch:namespace",
                "ContextKeyValues": ["/aws/sagemaker/TrainingJobs"],
                "ContextKeyType": "string",
            }
        ],
    )
    assert got["s3:GetObject"]["EvalDecision"] == "explicitDeny"  # Deny wins over Allow
    assert got["cloudwatch:PutMetricData"]["EvalDecision"] == "allowed"


def test_an_unknown_role_is_no_such_entity(iam):
    with pytest.raises(iam.exceptions.NoSuchEntityException):
        iam.simulate_principal_policy(
            PolicySourceArn="arn:aws:iam::123456789012:role/gone", ActionNames=["s3:GetObject"]
        )
