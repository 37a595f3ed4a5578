"""The local SageMaker's control plane: requests validated against botocore's SageMaker model,
answers in its shapes (parsed here by botocore's own parser), SageMaker's errors and events."""

from __future__ import annotations

import json

import pytest
from botocore.parsers import create_parser

from sluice_local.sagemaker.api import LocalSageMaker
from sluice_local.sagemaker.shapes import ApiError, operation

ROLE = "arn:aws:iam::123456789012:role/sm"
MODEL = {
    "ModelName": "m1",
    "ExecutionRoleArn": ROLE,
    "PrimaryContainer": {"Image": "sluice:local", "ModelDataUrl": "s3://b/m.tar.gz"},
}


@pytest.fixture
def sm(tmp_path):
    events: list[tuple[str, dict]] = []
    api = LocalSageMaker(tmp_path, lambda kind, detail: events.append((kind, detail)))
    api.events = events
    return api


def parsed(op: str, answer: dict) -> dict:
    """What boto3 makes of the answer: botocore's JSON parser on the operation's output shape."""
    response = {"body": json.dumps(answer).encode(), "headers": {}, "status_code": 200}
    return create_parser("json").parse(response, operation(op).output_shape)


def test_answers_are_in_sagemakers_shapes(sm):
    assert sm.call("CreateModel", MODEL)["ModelArn"].endswith(":model/m1")
    answer = sm.call("DescribeModel", {"ModelName": "m1"})
    assert set(answer) == {
        "ModelName",
        "PrimaryContainer",
        "ExecutionRoleArn",
        "CreationTime",
        "ModelArn",
    }
    described = parsed("DescribeModel", answer)
    assert described["CreationTime"].year >= 2026  # epoch seconds, read back as a datetime
    listed = parsed("ListModels", sm.call("ListModels", {}))
    assert [m["ModelName"] for m in listed["Models"]] == ["m1"]


def test_requests_are_validated_as_sagemaker_does(sm):
    with pytest.raises(ApiError) as e:
        sm.call("CreateModel", {"ExecutionRoleArn": ROLE})  # no ModelName
    assert e.value.code == "ValidationException" and "ModelName" in e.value.message
    job = {
        "TrainingJobName": "t1",
        "RoleArn": ROLE,
        "AlgorithmSpecification": {"TrainingImage": "sluice:local", "TrainingInputMode": "Bogus"},
        "OutputDataConfig": {"S3OutputPath": "s3://b/models/"},
        "ResourceConfig": {
            "InstanceType": "ml.g5.2xlarge",
            "InstanceCount": 1,
            "VolumeSizeInGB": 50,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": 60},
    }
    with pytest.raises(ApiError, match="enum value set") as e:
        sm.call("CreateTrainingJob", job)
    with pytest.raises(ApiError, match="regular expression") as e:
        sm.call("CreateModel", {**MODEL, "ModelName": "no spaces allowed"})


def test_documented_rules_that_depend_on_what_exists(sm):
    """The local SageMaker answers aws_rules with its own resources: a canary on a one-instance
    endpoint, a new instance type for a variant registered with Application Auto Scaling, and a
    transform job on a model whose weights come from ModelDataSource."""
    from moto import mock_aws

    sm.call("CreateModel", MODEL)
    for name, instance_type in (("c1", "ml.g5.xlarge"), ("c2", "ml.g6.xlarge")):
        variant = {
            "VariantName": "AllTraffic",
            "ModelName": "m1",
            "InstanceType": instance_type,
            "InitialInstanceCount": 1,
        }
        sm.call(
            "CreateEndpointConfig", {"EndpointConfigName": name, "ProductionVariants": [variant]}
        )
    sm.call("CreateEndpoint", {"EndpointName": "e", "EndpointConfigName": "c1"})
    sm.update(
        "Endpoint",
        "e",
        EndpointStatus="InService",
        ProductionVariants=[{"VariantName": "AllTraffic", "CurrentInstanceCount": 1}],
    )
    canary = {
        "EndpointName": "e",
        "EndpointConfigName": "c1",
        "DeploymentConfig": {
            "BlueGreenUpdatePolicy": {
                "TrafficRoutingConfiguration": {
                    "Type": "CANARY",
                    "CanarySize": {"Type": "CAPACITY_PERCENT", "Value": 10},
                    "WaitIntervalInSeconds": 5,
                }
            }
        },
    }
    with pytest.raises(ApiError, match=r"canary-at-most-half") as e:
        sm.call("UpdateEndpoint", canary)
    assert e.value.code == "ValidationException"
    with mock_aws():
        import boto3

        boto3.client("application-autoscaling", region_name="us-east-1").register_scalable_target(
            ServiceNamespace="sagemaker",
            ResourceId="endpoint/e/variant/AllTraffic",
            ScalableDimension="sagemaker:variant:DesiredInstanceCount",
            MinCapacity=1,
            MaxCapacity=2,
        )
        with pytest.raises(ApiError, match=r"scaled-variant-instance-type"):
            sm.call("UpdateEndpoint", {"EndpointName": "e", "EndpointConfigName": "c2"})
    # a transform job on a model whose weights come from ModelDataSource (uncompressed S3 prefix)
    source = {"S3Uri": "s3://b/m/", "S3DataType": "S3Prefix", "CompressionType": "None"}
    container = {"Image": "sluice:local", "ModelDataSource": {"S3DataSource": source}}
    sm.call("CreateModel", {**MODEL, "ModelName": "m2", "PrimaryContainer": container})
    job = {
        "ModelName": "m2",
        "TransformInput": {
            "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/in/"}}
        },
        "TransformOutput": {"S3OutputPath": "s3://b/out/"},
        "TransformResources": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1},
    }
    with pytest.raises(ApiError, match=r"transform-model-data-source"):
        sm.call("CreateTransformJob", {**job, "TransformJobName": "t2"})


def test_sagemakers_errors_for_missing_and_duplicate_resources(sm):
    with pytest.raises(ApiError, match="Could not find training job") as e:
        sm.call("DescribeTrainingJob", {"TrainingJobName": "nope"})
    assert e.value.code == "ValidationException"
    sm.call("CreateModel", MODEL)
    with pytest.raises(ApiError, match="already exists"):
        sm.call("CreateModel", MODEL)
    with pytest.raises(ApiError, match="Could not find model"):
        sm.call(
            "CreateTransformJob",
            {
                "TransformJobName": "j1",
                "ModelName": "missing",
                "TransformInput": {
                    "DataSource": {
                        "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/in/"}
                    }
                },
                "TransformOutput": {"S3OutputPath": "s3://b/out/"},
                "TransformResources": {"InstanceType": "ml.m5.xlarge", "InstanceCount": 1},
            },
        )


def test_lists_page_and_filter(sm):
    for i in range(3):
        sm.call("CreateModel", {**MODEL, "ModelName": f"m{i}"})
    first = sm.call("ListModels", {"MaxResults": 2, "SortOrder": "Ascending"})
    assert [m["ModelName"] for m in first["Models"]] == ["m0", "m1"]
    rest = sm.call(
        "ListModels", {"MaxResults": 2, "SortOrder": "Ascending", "NextToken": first["NextToken"]}
    )
    assert [m["ModelName"] for m in rest["Models"]] == ["m2"] and "NextToken" not in rest
    assert [m["ModelName"] for m in sm.call("ListModels", {"NameContains": "1"})["Models"]] == [
        "m1"
    ]


def test_model_packages_are_versioned_and_approvals_are_events(sm):
    sm.call("CreateModelPackageGroup", {"ModelPackageGroupName": "g"})
    spec = {
        "Containers": [{"Image": "sluice:local", "ModelDataUrl": "s3://b/m.tar.gz"}],
        "SupportedContentTypes": ["application/jsonlines"],
        "SupportedResponseMIMETypes": ["application/jsonlines"],
    }
    arns = [
        sm.call(
            "CreateModelPackage",
            {
                "ModelPackageGroupName": "g",
                "InferenceSpecification": spec,
                "ModelApprovalStatus": "PendingManualApproval",
                "CustomerMetadataProperties": {"decision": "promote"},
            },
        )["ModelPackageArn"]
        for _ in range(2)
    ]
    assert [a.rsplit("/", 1)[1] for a in arns] == ["1", "2"]
    sm.call(
        "UpdateModelPackage",
        {
            "ModelPackageArn": arns[1],
            "ModelApprovalStatus": "Approved",
            "CustomerMetadataProperties": {"endpoint": "e"},
        },
    )
    package = parsed(
        "DescribeModelPackage", sm.call("DescribeModelPackage", {"ModelPackageName": arns[1]})
    )
    assert package["ModelApprovalStatus"] == "Approved" and package["ModelPackageVersion"] == 2
    # SageMaker keeps the metadata an update does not mention
    assert package["CustomerMetadataProperties"] == {"decision": "promote", "endpoint": "e"}
    kinds = [k for k, _ in sm.events]
    assert kinds.count("SageMaker Model Package State Change") == 3  # two created, one approved
    detail = sm.events[-1][1]
    assert detail["ModelApprovalStatus"] == "Approved" and isinstance(detail["CreationTime"], int)
    listed = sm.call(
        "ListModelPackages", {"ModelPackageGroupName": "g", "ModelApprovalStatus": "Approved"}
    )
    assert [p["ModelPackageArn"] for p in listed["ModelPackageSummaryList"]] == [arns[1]]


def test_state_survives_a_restart(tmp_path):
    LocalSageMaker(tmp_path, lambda *_: None).call("CreateModel", MODEL)
    again = LocalSageMaker(tmp_path, lambda *_: None)
    assert again.call("DescribeModel", {"ModelName": "m1"})["ModelName"] == "m1"
