"""The local stack's reading of template.yaml: parameters as CloudFormation checks them,
intrinsic functions, the SAM transform, and what it can create."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice_local.deploy import RECORDED_ONLY, Deployer
from sluice_local.template import (
    Resolver,
    TemplateError,
    Unresolved,
    parameter_values,
    render_definition,
    samconfig_overrides,
    substitute,
    transform,
)

REPO = Path(__file__).resolve().parents[2]
SPEC = {
    "Parameters": {
        "Stage": {"Type": "String", "Default": "dev", "AllowedPattern": "^[a-z0-9-]{1,16}$"},
        "Mode": {"Type": "String", "Default": "A", "AllowedValues": ["A", "B"]},
        "Size": {"Type": "Number", "Default": 1, "MinValue": 1, "MaxValue": 10},
        "Subnets": {"Type": "CommaDelimitedList", "Default": ""},
    }
}


def test_parameters_are_checked_as_cloudformation_checks_them():
    values = parameter_values(SPEC, {"Size": "3", "Subnets": "a,b"})
    assert values == {"Stage": "dev", "Mode": "A", "Size": "3", "Subnets": ["a", "b"]}
    for bad, why in [
        ({"Mode": "C"}, "not one of"),
        ({"Size": "11"}, "outside"),
        ({"Size": "x"}, "not a number"),
        ({"Stage": "UPPER"}, "does not match"),
        ({"Nope": "1"}, "unknown parameter"),
    ]:
        with pytest.raises(TemplateError, match=why):
            parameter_values(SPEC, bad)


def test_intrinsic_functions():
    r = Resolver(
        {"Stage": "dev", "Subnets": ["a", "b"]},
        {"IsDev": {"Fn::Equals": [{"Ref": "Stage"}, "dev"]}},
        {"Bucket": {"Ref": "b-1", "Arn": "arn:aws:s3:::b-1"}},
    )
    assert (
        r.resolve({"Fn::Sub": "${Bucket.Arn}/x/${Stage}/${!Literal}"})
        == "arn:aws:s3:::b-1/x/dev/${Literal}"
    )
    assert (
        r.resolve({"Fn::Sub": ["${A}-${AWS::Region}", {"A": {"Ref": "Bucket"}}]}) == "b-1-us-east-1"
    )
    assert r.resolve({"Fn::If": ["IsDev", "yes", "no"]}) == "yes"
    assert r.resolve({"Fn::Join": [",", {"Ref": "Subnets"}]}) == "a,b"
    assert r.resolve({"Fn::Select": [1, {"Fn::Split": ["/", "x/y/z"]}]}) == "y"
    assert r.resolve({"K": {"Ref": "AWS::NoValue"}, "L": [1, {"Ref": "AWS::NoValue"}]}) == {
        "L": [1]
    }
    with pytest.raises(Unresolved):  # not created yet: the deployer tries it again later
        r.resolve({"Fn::GetAtt": ["Queue", "Arn"]})
    assert substitute('{"a": ${A}, "b": "${B}"}', {"A": 1}) == ('{"a": 1, "b": "${B}"}', ["B"])


def test_a_yaml_definition_is_rendered_as_cloudformation_renders_it():
    """Substitutions in the text first (bare ones become numbers and objects), then YAML -> JSON;
    a JSON definition is passed through as written."""
    import json

    text = (
        "# a comment\nTimeoutSeconds: ${T}\nStates:\n  A: {Type: Pass, Result: ${O}, End: true}\n"
    )
    rendered, _ = render_definition(text.replace("${O}", "'${O}'"), {"T": 60, "O": "x"})
    assert json.loads(rendered) == {
        "TimeoutSeconds": 60,
        "States": {"A": {"Type": "Pass", "Result": "x", "End": True}},
    }
    block = "States:\n  A:\n    Type: Pass\n    Result: ${O}\n    End: true\n"
    rendered, _ = render_definition(block, {"O": '{"VpcConfig": {"Subnets": ["a"]}}'})
    assert json.loads(rendered)["States"]["A"]["Result"] == {"VpcConfig": {"Subnets": ["a"]}}
    assert render_definition('{"a": ${A}}', {"A": 1}) == ('{"a": 1}', [])
    assert render_definition("a: ${B}", {})[1] == ["B"]


def test_step_functions_error_names_for_aws_sdk_tasks():
    """`ServiceName.ErrorName`, PascalCase as the AWS SDKs name the service, `Exception` added,
    for the errors the service models; `ServiceName.ServiceNameException` for the others."""
    from sluice_local.moto_fixes import aws_sdk_error_name

    # SageMaker's API models neither: they reach the state as SageMaker.SageMakerException (a
    # Retry naming SageMaker.ThrottlingException never fires on AWS)
    assert aws_sdk_error_name("sagemaker", "ThrottlingException") == "SageMaker.SageMakerException"
    assert aws_sdk_error_name("sagemaker", "ValidationException") == "SageMaker.SageMakerException"
    assert (
        aws_sdk_error_name("sagemaker", "ResourceNotFound") == "SageMaker.ResourceNotFoundException"
    )
    assert aws_sdk_error_name("ssm", "ThrottlingException") == "Ssm.ThrottlingException"
    assert (
        aws_sdk_error_name("applicationautoscaling", "ThrottlingException")
        == "ApplicationAutoScaling.ApplicationAutoScalingException"
    )
    assert aws_sdk_error_name("s3", "NoSuchKey") == "S3.NoSuchKeyException"
    assert (
        aws_sdk_error_name("applicationautoscaling", "ConcurrentUpdateException")
        == "ApplicationAutoScaling.ConcurrentUpdateException"
    )


def test_the_real_template_transforms_and_every_resource_has_a_local_equivalent():
    t = transform(REPO / "template.yaml", samconfig_overrides(REPO / "samconfig.toml"))
    types = {r["Type"] for r in t.template["Resources"].values()}
    creatable = set(Deployer(t, client=None, stack_name="x").creators) | set(RECORDED_ONLY)
    assert types <= creatable, types - creatable
    assert t.parameters["Stage"] == "local"  # samconfig.toml's [local] environment
    fn = t.template["Resources"]["StartTransformFunction"]["Properties"]
    assert t.local_file(fn["Code"]) == REPO / "functions"


def test_a_resource_type_it_cannot_create_is_reported_by_name(tmp_path):
    template = tmp_path / "template.yaml"
    template.write_text(
        "Transform: AWS::Serverless-2016-10-31\n"
        "Resources:\n"
        "  Network:\n    Type: AWS::EC2::VPC\n    Properties: {CidrBlock: 10.0.0.0/16}\n"
    )
    deployment = Deployer(transform(template, {}), client=None, stack_name="x").deploy()
    assert deployment.skipped == [
        {"id": "Network", "type": "AWS::EC2::VPC", "why": "no local equivalent: not created"}
    ]
