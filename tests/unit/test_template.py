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


def test_data_bucket_is_kms_encrypted_versioned_private_and_triggers_on_two_prefixes():
    p = R["DataBucket"]["Properties"]
    rule = p["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]
    assert rule["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    assert rule["BucketKeyEnabled"] is True
    assert p["VersioningConfiguration"]["Status"] == "Enabled"
    assert all(p["PublicAccessBlockConfiguration"].values())
    # outputs/, models/ and capture/ never trigger anything: no loops
    targets = {
        n["Filter"]["S3Key"]["Rules"][0]["Value"]: n["Queue"]["Fn::GetAtt"][0]
        for n in p["NotificationConfiguration"]["QueueConfigurations"]
    }
    assert targets == {"incoming/": "IncomingQueue", "training/": "TrainingQueue"}


def test_pass_role_is_limited_to_sagemaker():
    statements = R["StartTransformFunction"]["Properties"]["Policies"][0]["Statement"]
    (passrole,) = [s for s in statements if s["Action"] == "iam:PassRole"]
    assert passrole["Condition"] == {
        "StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}
    }


def test_outputs_name_what_operators_need():
    assert {
        "DataBucketName",
        "IncomingQueueUrl",
        "CurrentModelParameterName",
        "NotificationTopicArn",
        "RetrainStateMachineArn",
        "EndpointName",
        "ModelPackageGroupName",
    } <= set(T["Outputs"])


def test_state_machine_role_passes_only_the_sagemaker_role_and_scopes_names():
    statements = R["RetrainRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    by_sid = {s["Sid"]: s for s in statements}
    assert by_sid["PassExecutionRole"]["Condition"] == {
        "StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}
    }
    for arn in by_sid["SageMakerJobsAndModels"]["Resource"]:
        assert "sluice-${Stage}" in arn["Fn::Sub"]


def test_every_substitution_the_definition_uses_is_defined():
    import re

    from tests.retrain_harness import REPO

    used = set(re.findall(r"\$\{(\w+)\}", (REPO / "statemachine/retrain.asl.yaml").read_text()))
    defined = set(R["RetrainStateMachine"]["Properties"]["DefinitionSubstitutions"])
    assert used == defined


def test_the_definition_reads_as_written_and_each_service_has_one_retry_policy():
    """Valid YAML before substitution (editors, linters); every Retry is one of the policies the
    file's header lists, and each names only its own service's errors (or States.*)."""
    import json

    import yaml

    from tests.retrain_harness import DEFINITION

    doc = yaml.safe_load(DEFINITION.read_text())
    policies: set[str] = set()

    def walk(states: dict) -> None:
        for name, state in states.items():
            for retry in state.get("Retry", []):
                policies.add(json.dumps(retry, sort_keys=True))
                services = {e.split(".")[0] for e in retry["ErrorEquals"]} - {"States"}
                assert len(services) <= 1, (name, retry)
            for branch in state.get("Branches", []):
                walk(branch["States"])

    walk(doc["States"])
    # sagemaker-sdk (+ -read), sagemaker (optimized), ssm (+ -read), autoscaling, sns
    assert len(policies) == 7, sorted(policies)


def test_the_state_machine_role_grants_every_call_the_definition_makes():
    """Each Task's action (and .sync's describe, stop and managed rules) is in RetrainRole."""
    import yaml

    from tests.retrain_harness import DEFINITION

    iam_prefix = {"applicationautoscaling": "application-autoscaling"}
    granted: set[str] = set()
    for st in R["RetrainRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]:
        if isinstance(st, dict) and st.get("Effect") == "Allow":
            actions = st["Action"]
            granted |= {a.lower() for a in ([actions] if isinstance(actions, str) else actions)}
    needed: set[str] = set()

    def walk(states: dict) -> None:
        for state in states.values():
            resource = state.get("Resource", "")
            if resource.startswith("arn:aws:states:::"):
                parts = resource.removeprefix("arn:aws:states:::").removeprefix("aws-sdk:")
                service, action = parts.split(":")[:2]
                action, _, pattern = action.partition(".")
                prefix = iam_prefix.get(service, service)
                needed.add(f"{prefix}:{action}".lower())
                if pattern == "sync":  # Step Functions describes and stops the job itself
                    job = action.removeprefix("create")
                    needed.update({f"{prefix}:describe{job}", f"{prefix}:stop{job}"})
                    needed.update({"events:putrule", "events:puttargets", "events:describerule"})
            for branch in state.get("Branches", []):
                walk(branch["States"])

    walk(yaml.safe_load(DEFINITION.read_text())["States"])
    assert {n.lower() for n in needed} - granted == set()
