"""Invariants of template.yaml that the linters do not know about."""

from pathlib import Path

import pytest
from cfnlint.decode import cfn_yaml

REPO = Path(__file__).resolve().parents[2]
T = cfn_yaml.load(str(REPO / "template.yaml"))
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


SQS_SOURCES = [
    (name, event)
    for name, r in R.items()
    if r["Type"] == "AWS::Serverless::Function"
    for event, e in (r["Properties"].get("Events") or {}).items()
    if e["Type"] == "SQS"
]


@pytest.mark.parametrize(("function", "event"), SQS_SOURCES)
def test_an_sqs_poller_never_outgrows_its_functions_reserved_concurrency(function, event):
    """Lambda's SQS poller ignores reserved concurrency: past it the function is throttled and the
    throttled messages count receives, so a burst could reach the DLQ without ever running. AWS:
    keep ScalingConfig.MaximumConcurrency (2-1000) <= the function's reserved concurrency
    (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-scaling.html)."""
    props = R[function]["Properties"]
    maximum = (props["Events"][event]["Properties"].get("ScalingConfig") or {}).get(
        "MaximumConcurrency"
    )
    assert maximum is not None, f"{function}.{event} has no ScalingConfig.MaximumConcurrency"
    assert 2 <= maximum <= props["ReservedConcurrentExecutions"]


def test_the_sqs_sources_are_the_ones_sluice_has():
    assert sorted(SQS_SOURCES) == [
        ("RetrainOnUploadsFunction", "TrainingUploads"),
        ("StartTransformFunction", "Uploads"),
    ]


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
    # sagemaker-sdk (+ -read, + -find), sagemaker (optimized), ssm (+ -read), autoscaling, sns
    assert len(policies) == 8, sorted(policies)


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


def test_every_error_a_retry_or_catch_names_can_reach_its_state():
    """Step Functions names an aws-sdk error after the service's modelled errors, or
    `ServiceName.ServiceNameException` for the rest: a Retry on `SageMaker.ThrottlingException`
    (not a modelled SageMaker error) never fired on AWS."""
    import yaml

    from sluice_local.moto_fixes import SFN_ERROR_SERVICE_NAMES, aws_sdk_error_name, modelled_errors
    from tests.retrain_harness import DEFINITION

    doc = yaml.safe_load(DEFINITION.read_text())
    unreachable: list[str] = []

    def names_for(resource: str) -> set[str]:
        if resource.startswith("arn:aws:states:::aws-sdk:"):
            service = resource.split(":")[6]
            prefix = SFN_ERROR_SERVICE_NAMES[service]
            return {aws_sdk_error_name(service, c) for c in modelled_errors(service)} | {
                f"{prefix}.{prefix}Exception"
            }
        if resource.startswith("arn:aws:states:::sagemaker:"):
            return {"SageMaker.AmazonSageMakerException"}
        if resource.startswith("arn:aws:states:::sns:"):
            return set()
        return set()

    def walk(states: dict) -> None:
        for name, state in states.items():
            possible = names_for(state.get("Resource", ""))
            for handler in state.get("Retry", []) + state.get("Catch", []):
                for error in handler["ErrorEquals"]:
                    if not error.startswith("States.") and error not in possible:
                        unreachable.append(f"{name}: {error}")
            for branch in state.get("Branches", []):
                walk(branch["States"])

    walk(doc["States"])
    assert not unreachable, unreachable


# --- wiring: what one resource reads, another must emit or allow ---------------------------------

# (the metrics alarms and the dashboard read: tests/unit/test_ops_view.py)


def test_eventbridge_may_use_the_key_of_the_topic_it_publishes_to():
    """An EventBridge rule targets the encrypted topic: the SNS developer guide's key-policy
    statement for EventBridge carries no aws:SourceAccount/aws:SourceArn condition (EventBridge
    publishing to an encrypted topic does not support them), so a statement with one drops every
    notification RetrainFailedRule sends."""
    topics = {
        n: r
        for n, r in R.items()
        if r["Type"] == "AWS::SNS::Topic" and "KmsMasterKeyId" in r["Properties"]
    }
    targeted = [
        t["Arn"]["Ref"]
        for r in R.values()
        if r["Type"] == "AWS::Events::Rule"
        for t in r["Properties"].get("Targets", [])
        if isinstance(t["Arn"], dict) and t["Arn"].get("Ref") in topics
    ]
    assert targeted
    statements = R["DataKey"]["Properties"]["KeyPolicy"]["Statement"]
    usable = [
        s
        for s in statements
        if s["Principal"].get("Service") == "events.amazonaws.com"
        and not any(
            key.startswith("aws:Source")
            for cond in (s.get("Condition") or {}).values()
            for key in cond
        )
        and {"kms:Decrypt"} <= set(s["Action"])
        and any(a.startswith("kms:GenerateDataKey") for a in s["Action"])
    ]
    assert usable, "no condition-free key statement for EventBridge publishing to the topic"


def test_the_template_and_the_functions_share_one_instance_family_table():
    """The template's conditions list the families of functions/sluice_functions/instances.py
    that each parameter may name (SageMaker's instance-type enums)."""
    from botocore.session import get_session

    from sluice_functions.instances import GPU_FAMILIES, LOCAL_STORAGE_FAMILIES, family

    model = get_session().get_service_model("sagemaker")

    def families_of(shape: str) -> set[str]:
        return {family(t) for t in model.shape_for(shape).enum}

    def listed(condition) -> set[str]:
        if isinstance(condition, dict) and "Fn::Or" in condition:
            return set().union(*(listed(c) for c in condition["Fn::Or"]))
        return {condition["Fn::Equals"][1]}

    c = T["Conditions"]
    assert listed(c["TrainingLocalStorage"]) == LOCAL_STORAGE_FAMILIES & families_of(
        "TrainingInstanceType"
    )
    variants = families_of("ProductionVariantInstanceType")
    assert listed(c["EndpointLocalStorage"]) == LOCAL_STORAGE_FAMILIES & variants
    assert listed(c["EndpointGpu"]) == GPU_FAMILIES & variants


def test_sam_deploys_with_the_capabilities_samconfig_grants():
    """A named IAM role needs CAPABILITY_NAMED_IAM (and is account-wide: a second region's stack
    collides); samconfig.toml grants CAPABILITY_IAM."""
    import tomllib

    config = tomllib.loads((REPO / "samconfig.toml").read_text())
    capabilities = config["default"]["deploy"]["parameters"]["capabilities"].split()
    named = [
        n
        for n, r in R.items()
        if r["Type"] in ("AWS::IAM::Role", "AWS::IAM::ManagedPolicy", "AWS::IAM::User")
        and ({"RoleName", "ManagedPolicyName", "UserName"} & set(r["Properties"]))
    ]
    assert not named or "CAPABILITY_NAMED_IAM" in capabilities, named


def test_the_state_machine_may_replace_target_tracking_alarms():
    """Application Auto Scaling deletes and recreates a target-tracking policy's alarms with the
    caller's permissions when PutScalingPolicy runs again (the second release)."""
    statements = R["RetrainRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
    actions = {
        a
        for s in statements
        if isinstance(s, dict)
        for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
    }
    assert {
        "cloudwatch:PutMetricAlarm",
        "cloudwatch:DescribeAlarms",
        "cloudwatch:DeleteAlarms",
    } <= actions


def test_docs_carry_the_rule_set_table():
    from sluice_local.aws_rules import table

    text = (REPO / "docs/local.md").read_text()
    begin, end = text.index("<!-- rules:begin -->\n"), text.index("<!-- rules:end -->")
    assert text[begin + len("<!-- rules:begin -->\n") : end].strip() == table()


def test_a_deployment_cannot_be_given_an_empty_image():
    """SageMaker refuses an empty image (ContainerImage: [\\S]+); ImageUri defaulted to ""."""
    from sluice_local.template import TemplateError, load_template, parameter_values

    template = load_template(REPO / "template.yaml")
    assert "Default" not in template["Parameters"]["ImageUri"]
    with pytest.raises(TemplateError, match="ImageUri has no default"):
        parameter_values(template, {})
    with pytest.raises(TemplateError, match="does not match"):
        parameter_values(template, {"ImageUri": ""})
    assert parameter_values(template, {"ImageUri": "1.dkr.ecr.us-east-1.amazonaws.com/sluice:1"})
