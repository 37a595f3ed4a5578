"""The local stack's speed patches to moto's Step Functions interpreter
(local/sluice_local/moto_fixes.py `_speed_patches`): a definition's paths and service calls give
the same answers with them as without."""

from __future__ import annotations

import datetime
import json
import time

import boto3
import pytest
from moto import mock_aws

from sluice_local import moto_fixes

# JSONPath in each place it is read (InputPath, Parameters, ResultSelector, ResultPath,
# OutputPath), two aws-sdk calls to one service and one to another
DEFINITION = {
    "StartAt": "Shape",
    "States": {
        "Shape": {
            "Type": "Pass",
            "InputPath": "$.job",
            "Parameters": {"name.$": "$.name", "tags.$": "$.tags[1]", "all.$": "$.tags[*]"},
            "ResultPath": "$.shaped",
            "Next": "Put",
        },
        "Put": {
            "Type": "Task",
            "Resource": "arn:aws:states:::aws-sdk:ssm:putParameter",
            "Parameters": {"Name.$": "$.shaped.name", "Value.$": "$.shaped.tags", "Type": "String"},
            "ResultSelector": {"version.$": "$.Version"},
            "ResultPath": "$.put",
            "Next": "Get",
        },
        "Get": {
            "Type": "Task",
            "Resource": "arn:aws:states:::aws-sdk:ssm:getParameter",
            "Parameters": {"Name.$": "$.shaped.name"},
            "ResultSelector": {"value.$": "$.Parameter.Value"},
            "ResultPath": "$.got",
            "Next": "Queue",
        },
        "Queue": {
            "Type": "Task",
            "Resource": "arn:aws:states:::aws-sdk:sqs:createQueue",
            "Parameters": {"QueueName.$": "$.shaped.name"},
            "ResultPath": None,
            "OutputPath": "$",
            "End": True,
        },
    },
}


def run(input_doc: dict) -> dict:
    """The definition's output in a fresh moto, executed by moto's interpreter."""
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        sfn = boto3.client("stepfunctions", region_name="us-east-1")
        arn = sfn.create_state_machine(
            name="m",
            definition=json.dumps(DEFINITION),
            roleArn="arn:aws:iam::123456789012:role/r",
        )["stateMachineArn"]
        ex = sfn.start_execution(stateMachineArn=arn, input=json.dumps(input_doc))["executionArn"]
        deadline = time.monotonic() + 30
        while (d := sfn.describe_execution(executionArn=ex))["status"] == "RUNNING":
            assert time.monotonic() < deadline, "the execution did not end"
            time.sleep(0.05)
        assert d["status"] == "SUCCEEDED", d
        return json.loads(d["output"])


def test_a_definition_answers_the_same_with_the_speed_patches(monkeypatch):
    doc = {"job": {"name": "sluice-x", "tags": ["a", "b", "c"]}, "other": {"n": [1, 2]}}
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    before = run(doc)
    for owner, name, value in moto_fixes._speed_patches():
        monkeypatch.setattr(owner, name, value)
    first, again = run(doc), run(doc)  # again: the cached paths and clients, a fresh moto
    assert first == again == before
    assert before["shaped"] == {"name": "sluice-x", "tags": "b", "all": ["a", "b", "c"]}
    assert before["got"] == {"value": "b"}


def test_json_copy_copies_deeply_and_anything_else_as_deepcopy_does():
    when = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)
    value = {"a": [{"b": 1}, "s", 2.5, None, True], "when": when, "pair": (1, [2])}
    copied = moto_fixes.json_copy(value)
    assert copied == value
    copied["a"][0]["b"] = 9
    copied["pair"][1].append(3)
    assert value["a"][0]["b"] == 1 and value["pair"] == (1, [2])


def test_one_client_per_service_and_region():
    made = []

    def boto_client_for(region, service, state_credentials=None):
        made.append((region, service))
        return object()

    client_for = moto_fixes.cached_boto_client_for(boto_client_for)
    assert client_for("us-east-1", "ssm") is client_for(region="us-east-1", service="ssm")
    assert client_for("us-east-1", "sqs") is not client_for("us-east-1", "ssm")
    assert client_for("eu-west-1", "ssm") is not client_for("us-east-1", "ssm")
    # wrapping the wrapper (the patches made twice) shares the same clients
    assert moto_fixes.cached_boto_client_for(client_for)("us-east-1", "ssm") is client_for(
        "us-east-1", "ssm"
    )
    assert sorted(made) == [("eu-west-1", "ssm"), ("us-east-1", "sqs"), ("us-east-1", "ssm")]


@pytest.mark.parametrize("path", ["$.a.b[0]", "$.tags[*]", "$"])
def test_a_json_path_is_parsed_once(path):
    calls = []

    def parse(p):
        calls.append(p)
        return object()

    cached = moto_fixes.cached_json_path_parse(parse)
    assert cached(path) is moto_fixes.cached_json_path_parse(parse)(path)
    assert calls == [path]
