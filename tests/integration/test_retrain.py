"""The retraining state machine, executed unchanged by moto's Step Functions interpreter.

Each path asserts the calls the execution made (from its own history), the SSM parameter batch
inference reads, the model registry and the report published to the topic.
"""

from __future__ import annotations

import json

import boto3
import pytest

from tests import retrain_harness as h

# every request checked against AWS's own rules (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("strict_aws")

CHAMPION = h.CHAMPION
CHAMPION_DATA = h.CHAMPION_DATA


@pytest.fixture
def world(monkeypatch):
    yield from h.world(monkeypatch)


def sm():
    return boto3.client("sagemaker", region_name=h.REGION)


def current_model() -> str:
    return boto3.client("ssm", region_name=h.REGION).get_parameter(Name=h.PARAM)["Parameter"][
        "Value"
    ]


def packages() -> list[dict]:
    found = sm().list_model_package_groups()  # the group exists
    assert found["ModelPackageGroupSummaryList"]
    listed = sm().list_model_packages(ModelPackageGroupName=h.GROUP)["ModelPackageSummaryList"]
    return [sm().describe_model_package(ModelPackageName=p["ModelPackageArn"]) for p in listed]


def training_request(execution_arn: str) -> dict:
    sfn = boto3.client("stepfunctions", region_name=h.REGION)
    for e in sfn.get_execution_history(executionArn=execution_arn, maxResults=1000)["events"]:
        d = e.get("taskScheduledEventDetails")
        if d and d["resource"].startswith("createTrainingJob"):
            return json.loads(d["parameters"])
    raise AssertionError("no CreateTrainingJob call")


def test_metric_definitions_are_the_containers():
    """CreateTrainingJob scrapes exactly the metric lines the container prints."""
    from sluice.metrics import METRIC_DEFINITIONS

    text = h.definition(h.substitutions(NotificationTopicArn="arn:aws:sns:us-east-1:1:t"))
    spec = json.loads(text)["States"]["TrainingRequest"]["Parameters"]["AlgorithmSpecification"]
    assert spec["MetricDefinitions"] == METRIC_DEFINITIONS


def test_first_model_is_promoted_within_the_sanity_bound(world):
    d = h.run(world["arn"], "first", {"reason": "manual"})
    assert d["status"] == "SUCCEEDED", h.explain(d)
    out = json.loads(d["output"])
    job = out["trainingJob"]
    assert out["outcome"] == "promoted" and out["decision"]["decision"] == "promote"
    assert "first model" in out["decision"]["why"]
    assert current_model() == job
    assert (
        h.calls(d["executionArn"])
        == [
            "ssm:getParameter",
            "sagemaker:createTrainingJob.sync",  # Step Functions waits for the job itself
            "sagemaker:createModelPackage",
            # deployment and edge branches interleave; check each below
            *h.calls(d["executionArn"])[3:],
        ]
    )
    made = h.calls(d["executionArn"])
    deploy = [
        c
        for c in made
        if c.split(":")[-1]
        in {
            "createModel",
            "createEndpointConfig",
            "describeEndpoint",
            "createEndpoint",
            "updateEndpoint",
            "putParameter",
            "updateModelPackage",
            "registerScalableTarget",
            "putScalingPolicy",
        }
    ]
    assert deploy == [
        "sagemaker:createModel",
        "sagemaker:createEndpointConfig",
        "sagemaker:describeEndpoint",  # none yet -> create
        "sagemaker:createEndpoint",
        "sagemaker:describeEndpoint",  # Creating
        "sagemaker:describeEndpoint",  # InService, serving the new config
        "ssm:putParameter",
        "sagemaker:updateModelPackage",
        "applicationautoscaling:registerScalableTarget",
        "applicationautoscaling:putScalingPolicy",
    ]
    assert "sagemaker:createCompilationJob" in made
    # the first model trains without a baseline channel
    request = training_request(d["executionArn"])
    assert [c["ChannelName"] for c in request["InputDataConfig"]] == ["train"]
    assert request["EnableManagedSpotTraining"] is True
    assert (
        request["StoppingCondition"]["MaxWaitTimeInSeconds"]
        >= request["StoppingCondition"]["MaxRuntimeInSeconds"]
    )
    assert request["HyperParameters"]["artifacts_s3_uri"] == (
        f"s3://{h.BUCKET}/models/{job}/artifacts/"
    )
    assert "baseline_s3_uri" not in request["HyperParameters"]
    [pkg] = packages()
    assert pkg["ModelApprovalStatus"] == "Approved"
    assert pkg["CustomerMetadataProperties"]["decision"] == "promote"
    endpoint = sm().describe_endpoint(EndpointName=h.ENDPOINT)
    assert endpoint["EndpointConfigName"] == job
    config = sm().describe_endpoint_config(EndpointConfigName=job)
    assert config["DataCaptureConfig"]["DestinationS3Uri"] == f"s3://{h.BUCKET}/capture/endpoint/"
    assert out["edge"]["status"] == "COMPLETED"
    # the drift baseline for the new champion, from its training data and its own tokenizer
    assert out["endpoint"]["baseline"] == {"job": job, "status": "Completed"}
    assert "sagemaker:createProcessingJob.sync" in made
    baseline = sm().describe_processing_job(ProcessingJobName=job)
    assert baseline["AppSpecification"]["ContainerEntrypoint"][:3] == [
        "sluice",
        "monitor",
        "baseline",
    ]
    [output] = baseline["ProcessingOutputConfig"]["Outputs"]
    assert output["S3Output"]["S3Uri"] == f"s3://{h.BUCKET}/monitoring/baseline/{job}/"
    [note] = h.notifications(world)
    assert note["outcome"] == "promoted" and note["model"] == job


def test_challenger_that_beats_the_champion_is_swapped_in_blue_green(world):
    h.install_champion()
    world["sim"].metrics = {
        "gate_challenger": 30.0,
        "gate_baseline": 40.0,
        "gate_improvement": 0.25,
    }
    doc = {
        "reason": "new-data",
        "trainingData": f"s3://{h.BUCKET}/training/",
        "validationData": f"s3://{h.BUCKET}/validation/",
        "hyperparameters": {"max_steps": "500"},
    }
    d = h.run(world["arn"], "better", doc)
    assert d["status"] == "SUCCEEDED", h.explain(d)
    out = json.loads(d["output"])
    assert out["outcome"] == "promoted" and out["decision"]["improvement"] == 0.25
    assert out["champion"] == CHAMPION and out["trigger"] == "new-data"
    request = training_request(d["executionArn"])
    channels = {
        c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"]
        for c in request["InputDataConfig"]
    }
    # the champion's artifacts ride along so both are scored on the same held-out records
    assert channels == {
        "train": f"s3://{h.BUCKET}/training/",
        "validation": f"s3://{h.BUCKET}/validation/",
        "baseline": CHAMPION_DATA,
    }
    assert request["HyperParameters"]["max_steps"] == "500"
    # what an adapter trained with lora_base=reference names as its base
    assert request["HyperParameters"]["baseline_s3_uri"] == CHAMPION_DATA
    [update] = world["sim"].updates
    policy = update["DeploymentConfig"]["BlueGreenUpdatePolicy"]
    assert policy["TrafficRoutingConfiguration"]["Type"] == "CANARY"
    assert policy["TrafficRoutingConfiguration"]["CanarySize"] == {
        "Type": "CAPACITY_PERCENT",
        "Value": 10,
    }
    assert {
        a["AlarmName"] for a in update["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]
    } == {"sluice-test-endpoint-5xx", "sluice-test-endpoint-latency"}
    assert update["RetainAllVariantProperties"] is True
    assert current_model() == out["trainingJob"]
    assert (
        sm().describe_endpoint(EndpointName=h.ENDPOINT)["EndpointConfigName"] == out["trainingJob"]
    )


def test_challenger_that_does_not_beat_the_margin_is_recorded_and_rejected(world):
    h.install_champion()
    world["sim"].metrics = {
        "gate_challenger": 39.9,
        "gate_baseline": 40.0,
        "gate_improvement": 0.0025,
    }
    d = h.run(world["arn"], "worse", {"reason": "schedule"})
    assert d["status"] == "SUCCEEDED", h.explain(d)
    out = json.loads(d["output"])
    assert out["outcome"] == "rejected" and "< margin 0.01" in out["decision"]["why"]
    made = h.calls(d["executionArn"])
    assert not {"sagemaker:createModel", "sagemaker:updateEndpoint", "ssm:putParameter"} & set(made)
    assert current_model() == CHAMPION
    [pkg] = packages()
    assert pkg["ModelApprovalStatus"] == "Rejected"
    assert pkg["CustomerMetadataProperties"]["improvement"] == "0.0025"
    [note] = h.notifications(world)
    assert note["outcome"] == "rejected" and note["trigger"] == "schedule"


def test_first_model_outside_the_sanity_bound_is_rejected(world):
    world["sim"].metrics = {"gate_challenger": 5000.0}
    d = h.run(world["arn"], "hopeless", {})
    out = json.loads(d["output"])
    assert d["status"] == "SUCCEEDED" and out["outcome"] == "rejected"
    assert current_model() == "none"


def test_training_failure_is_reported_and_changes_nothing(world):
    h.install_champion()
    world["sim"].training = "Failed"
    d = h.run(world["arn"], "oom", {"reason": "drift", "violations": [{"feature_name": "tokens"}]})
    assert d["status"] == "FAILED"
    assert d["error"] == "TrainingFailed" and "CUDA out of memory" in d["cause"]
    assert current_model() == CHAMPION
    assert packages() == []
    [note] = h.notifications(world)
    assert note["outcome"] == "failed" and note["trigger"] == "drift"
    assert note["violations"] == [{"feature_name": "tokens"}]


def states_entered(d: dict) -> list[str]:
    sfn = boto3.client("stepfunctions", region_name=h.REGION)
    events = sfn.get_execution_history(executionArn=d["executionArn"], maxResults=1000)["events"]
    return [
        e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e
    ]


def test_a_training_quota_in_use_waits_instead_of_failing(world):
    """CreateTrainingJob answering ResourceLimitExceeded (the account's training quota in use by
    other jobs): no job exists, so the execution waits 5 minutes and tries again, and trains
    once the quota frees; a quota that stays in use is reported after TrainingQuotaWaits."""
    h.install_champion()
    world["sim"].metrics = {
        "gate_challenger": 30.0,
        "gate_baseline": 40.0,
        "gate_improvement": 0.25,
    }
    world["sim"].quota_refusals = 8  # each round: the call and its 3 retries
    d = h.run(world["arn"], "quota", {"reason": "schedule"})
    assert d["status"] == "SUCCEEDED", h.explain(d)
    assert json.loads(d["output"])["outcome"] == "promoted"
    states = states_entered(d)
    assert states.count("WaitForTrainingQuota") == 2 and states.count("Train") == 3
    assert world["sim"].quota_refusals == 0

    arn = h.create_state_machine(world, name="sluice-test-retrain-quota", TrainingQuotaWaits=1)
    world["sim"].quota_refusals = 10**6
    d = h.run(arn, "quota-forever", {"reason": "schedule"})
    assert d["status"] == "FAILED" and "ResourceLimitExceeded" in d["cause"], h.explain(d)
    assert states_entered(d).count("WaitForTrainingQuota") == 1
    note = h.notifications(world)[-1]
    assert note["outcome"] == "failed" and "training job usage" in note["cause"]


def training_jobs() -> list[dict]:
    sm = boto3.client("sagemaker", region_name=h.REGION)
    names = [j["TrainingJobName"] for j in sm.list_training_jobs()["TrainingJobSummaries"]]
    return [sm.describe_training_job(TrainingJobName=n) for n in names]


def test_a_training_job_that_found_no_capacity_waits_and_trains_under_a_new_name(world):
    """SageMaker created the job and failed it with CapacityError: the execution waits 5 minutes
    and trains again under a new name (SageMaker never reuses one), and releases that job's
    model; instances that never come are reported after TrainingQuotaWaits."""
    h.install_champion()
    world["sim"].metrics = {
        "gate_challenger": 30.0,
        "gate_baseline": 40.0,
        "gate_improvement": 0.25,
    }
    world["sim"].capacity_failures = 2
    d = h.run(world["arn"], "capacity", {"reason": "schedule"})
    assert d["status"] == "SUCCEEDED", h.explain(d)
    out = json.loads(d["output"])
    assert out["outcome"] == "promoted"
    assert states_entered(d).count("WaitForTrainingCapacity") == 2
    jobs = sorted(training_jobs(), key=lambda j: j["CreationTime"])
    first = jobs[0]["TrainingJobName"]
    assert [j["TrainingJobName"] for j in jobs] == [first, f"{first}-c1", f"{first}-c2"]
    assert [j["TrainingJobStatus"] for j in jobs] == ["Failed", "Failed", "Completed"]
    assert all(len(j["TrainingJobName"]) <= 63 for j in jobs)
    assert current_model() == f"{first}-c2"

    arn = h.create_state_machine(world, name="sluice-test-retrain-capacity", TrainingQuotaWaits=1)
    world["sim"].capacity_failures = 10**6
    d = h.run(arn, "capacity-forever", {"reason": "schedule"})
    assert d["status"] == "FAILED" and d["error"] == "TrainingFailed", h.explain(d)
    assert "CapacityError" in d["cause"]
    assert states_entered(d).count("WaitForTrainingCapacity") == 1
    assert h.notifications(world)[-1]["outcome"] == "failed"


def test_missing_gate_metrics_fail_loudly(world):
    world["sim"].metrics = {"train_loss": 2.0}
    d = h.run(world["arn"], "nofigures", {})
    assert d["status"] == "FAILED" and d["error"] == "NoGateFigures"
    assert current_model() == "none"


def test_rollback_leaves_batch_on_the_champion(world):
    h.install_champion()
    world["sim"].metrics = {
        "gate_challenger": 30.0,
        "gate_baseline": 40.0,
        "gate_improvement": 0.25,
    }
    world["sim"].deployment = "RolledBack"
    d = h.run(world["arn"], "rollback", {})
    assert d["status"] == "FAILED" and d["error"] == "EndpointRolledBack", d
    assert f"serves {CHAMPION}, not" in d["cause"]
    assert current_model() == CHAMPION
    [pkg] = packages()
    assert pkg["ModelApprovalStatus"] == "Rejected"
    [note] = h.notifications(world)
    assert note["outcome"] == "failed" and note["error"] == "EndpointRolledBack"


def test_neo_failure_does_not_block_promotion(world):
    world["sim"].compilation = "FAILED"
    d = h.run(world["arn"], "neo", {})
    assert d["status"] == "SUCCEEDED", h.explain(d)
    out = json.loads(d["output"])
    assert out["outcome"] == "promoted" and current_model() == out["trainingJob"]
    assert out["edge"]["status"] == "FAILED" and "TVM" in out["edge"]["reason"]
    assert out["edge"]["onnx"].endswith("/artifacts/edge/model.onnx")


def test_training_that_never_finishes_is_stopped_and_reported(world):
    world["sim"].training = "InProgress"
    arn = h.create_state_machine(world, name="sluice-test-retrain-slow", TrainingTimeoutSeconds=2)
    d = h.run(arn, "slow", {})
    assert d["status"] == "FAILED" and d["error"] == "TrainingTimedOut", h.explain(d)
    assert "ran past 2 s" in d["cause"]
    made = h.calls(d["executionArn"])
    assert made == [
        "ssm:getParameter",
        "sagemaker:createTrainingJob.sync",
        "sagemaker:stopTrainingJob",  # it would bill on otherwise
        "sns:publish",
    ]
    assert current_model() == "none"


def test_vpc_and_on_demand_deployments_get_their_own_requests(world):
    """The template's other branches: VpcConfig on jobs and models, spot off (no MaxWait)."""
    vpc = {"Subnets": ["subnet-1", "subnet-2"], "SecurityGroupIds": ["sg-1"]}
    arn = h.create_state_machine(
        world,
        name="sluice-test-retrain-vpc",
        VpcConfig=json.dumps({"VpcConfig": vpc}),
        UseSpot="false",
        TrainingStoppingCondition='{"MaxRuntimeInSeconds": 3600}',
    )
    d = h.run(arn, "vpc", {})
    assert d["status"] == "SUCCEEDED", h.explain(d)
    job = json.loads(d["output"])["trainingJob"]
    request = training_request(d["executionArn"])
    assert request["VpcConfig"] == vpc and request["EnableManagedSpotTraining"] is False
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600}
    assert sm().describe_model(ModelName=job)["VpcConfig"] == vpc


# --- AWS's documented rules on the release path ---------------------------------------------------

BETTER = {"gate_challenger": 30.0, "gate_baseline": 40.0, "gate_improvement": 0.25}


def test_a_one_instance_endpoint_swaps_all_at_once_under_the_same_alarms(world):
    """A canary must be at most half of the variant's instances (TrafficRoutingConfig): on the
    default one-instance endpoint a 10% canary is refused, so every swap became a rollback."""
    h.install_champion(instances=1)
    world["sim"].metrics = BETTER
    d = h.run(world["arn"], "one-instance", {"reason": "manual"})
    assert d["status"] == "SUCCEEDED", h.explain(d)
    assert json.loads(d["output"])["outcome"] == "promoted"
    [update] = world["sim"].updates
    policy = update["DeploymentConfig"]["BlueGreenUpdatePolicy"]
    assert policy["TrafficRoutingConfiguration"] == {
        "Type": "ALL_AT_ONCE",
        "WaitIntervalInSeconds": int(h.substitutions()["CanaryBakeSeconds"]),
    }
    assert policy["TerminationWaitInSeconds"] == int(h.substitutions()["CanaryBakeSeconds"])
    assert len(update["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]) == 2


def test_a_canary_on_one_instance_is_refused_as_sagemaker_refuses_it(world):
    """The rule the swap above avoids, as the local stack enforces it."""
    from sluice_local import aws_rules

    h.install_champion(instances=1)
    request = {
        "EndpointName": h.ENDPOINT,
        "EndpointConfigName": CHAMPION,
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
    from moto.sagemaker.models import sagemaker_backends

    backend = sagemaker_backends[h.ACCOUNT][h.REGION]
    found = aws_rules.problems("sagemaker", "UpdateEndpoint", request, h.MotoWorld(backend))
    assert any("[canary-at-most-half]" in f for f in found), found


def test_a_changed_instance_type_deregisters_auto_scaling_before_the_swap(world):
    """SageMaker refuses an update that changes the instance type of a variant registered with
    Application Auto Scaling: the state machine deregisters it first and registers it again
    after the swap."""
    h.install_champion(instance_type="ml.m5.xlarge")
    aas = boto3.client("application-autoscaling", region_name=h.REGION)
    target = {
        "ServiceNamespace": "sagemaker",
        "ResourceId": f"endpoint/{h.ENDPOINT}/variant/AllTraffic",
        "ScalableDimension": "sagemaker:variant:DesiredInstanceCount",
    }
    aas.register_scalable_target(**target, MinCapacity=1, MaxCapacity=4)
    world["sim"].metrics = BETTER
    d = h.run(world["arn"], "new-type", {"reason": "manual"})
    assert d["status"] == "SUCCEEDED", h.explain(d)
    out = json.loads(d["output"])
    assert out["outcome"] == "promoted", out
    assert "DeregisterScalableTarget" in h.explain(d)
    assert len(world["sim"].updates) == 1
    # registered again for the new fleet
    [registered] = aas.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert registered["ResourceId"] == target["ResourceId"]


def test_the_same_instance_type_keeps_auto_scaling_registered_through_the_swap(world):
    h.install_champion()  # ml.g4dn.xlarge, as the template (here) deploys
    world["sim"].metrics = BETTER
    d = h.run(world["arn"], "same-type", {"reason": "manual"})
    assert d["status"] == "SUCCEEDED", h.explain(d)
    assert "DeregisterScalableTarget" not in h.explain(d)


def champion_model(**container) -> None:
    """The current model, replaced by one described otherwise than PrimaryContainer.ModelDataUrl."""
    h.install_champion()
    sm().delete_model(ModelName=CHAMPION)
    sm().create_model(ModelName=CHAMPION, ExecutionRoleArn=h.ROLE, **container)


def test_a_champion_described_with_containers_is_still_the_baseline(world):
    """DescribeModel answers `Containers` for a model created with them; reading only
    PrimaryContainer.ModelDataUrl was States.Runtime, past every Catch."""
    champion_model(Containers=[{"Image": "img", "ModelDataUrl": CHAMPION_DATA}])
    world["sim"].metrics = BETTER
    d = h.run(world["arn"], "containers", {"reason": "manual"})
    assert d["status"] == "SUCCEEDED", h.explain(d)
    channels = {c["ChannelName"]: c for c in training_request(d["executionArn"])["InputDataConfig"]}
    assert channels["baseline"]["DataSource"]["S3DataSource"]["S3Uri"] == CHAMPION_DATA


def test_a_champion_without_artifacts_is_reported_not_a_runtime_error(world):
    champion_model(PrimaryContainer={"Image": "img"})
    d = h.run(world["arn"], "no-artifacts", {"reason": "manual"})
    [note] = h.notifications(world)
    assert note["outcome"] == "failed" and note["error"] == "ChampionArtifactsUnknown", note
    assert CHAMPION in note["cause"]
    assert "CreateTrainingJob" not in " ".join(h.calls(d["executionArn"]))
