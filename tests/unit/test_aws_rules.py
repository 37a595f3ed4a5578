"""Each documented rule refuses what AWS refuses and lets through what it accepts."""

from __future__ import annotations

import pytest

from sluice_local import aws_rules

KEY = "arn:aws:kms:us-east-1:123456789012:key/k"


class World(aws_rules.Unknown):
    """What exists, as the local SageMaker and the deployer answer it."""

    def __init__(
        self, variants=None, config=None, scaled=(), visibility=None, timeout=None, containers=None
    ):
        self.variants, self.config, self.scaled = variants, config, set(scaled)
        self.visibility, self.timeout, self.containers = visibility, timeout, containers

    def endpoint_variants(self, endpoint):
        return self.variants

    def config_variants(self, config):
        return self.config

    def scaled_variants(self, endpoint):
        return self.scaled

    def queue_visibility_timeout(self, arn):
        return self.visibility

    def function_timeout(self, name):
        return self.timeout

    def model_containers(self, model):
        return self.containers


def refused(service, op, params, world=None) -> list[str]:
    return [p.rsplit("[", 1)[1].rstrip("]") for p in aws_rules.problems(service, op, params, world)]


def test_every_rule_names_an_aws_document():
    assert len({r.id for r in aws_rules.RULES}) == len(aws_rules.RULES)
    for r in aws_rules.RULES:
        assert r.source.startswith("https://docs.aws.amazon.com/"), r


@pytest.mark.parametrize(("instance", "bad"), [("ml.g5.xlarge", True), ("ml.m5.xlarge", False)])
def test_volume_keys_on_local_storage(instance, bad):
    cluster = {"InstanceType": instance, "InstanceCount": 1, "VolumeKmsKeyId": KEY}
    processing = {"ProcessingResources": {"ClusterConfig": cluster}}
    training = {"ResourceConfig": cluster}
    tuning = {"TrainingJobDefinition": {"ResourceConfig": cluster}}
    endpoint = {"KmsKeyId": KEY, "ProductionVariants": [{"InstanceType": instance}]}
    assert bool(refused("sagemaker", "CreateProcessingJob", processing)) == bad
    assert bool(refused("sagemaker", "CreateTrainingJob", training)) == bad
    assert bool(refused("sagemaker", "CreateHyperParameterTuningJob", tuning)) == bad
    assert bool(refused("sagemaker", "CreateEndpointConfig", endpoint)) == bad
    del endpoint["KmsKeyId"]
    assert not refused("sagemaker", "CreateEndpointConfig", endpoint)


@pytest.mark.parametrize(
    ("spot", "stop", "bad"),
    [
        (True, {"MaxRuntimeInSeconds": 100, "MaxWaitTimeInSeconds": 200}, False),
        (True, {"MaxRuntimeInSeconds": 300, "MaxWaitTimeInSeconds": 200}, True),
        (True, {"MaxRuntimeInSeconds": 100}, True),
        (False, {"MaxRuntimeInSeconds": 100, "MaxWaitTimeInSeconds": 200}, True),
        (False, {"MaxRuntimeInSeconds": 100}, False),
    ],
)
def test_spot_training_waits_at_least_as_long_as_it_runs(spot, stop, bad):
    request = {"EnableManagedSpotTraining": spot, "StoppingCondition": stop, "ResourceConfig": {}}
    assert bool(refused("sagemaker", "CreateTrainingJob", request)) == bad


def update(kind="CANARY", size=None) -> dict:
    routing = {"Type": kind, "WaitIntervalInSeconds": 5}
    if size:
        routing["CanarySize" if kind == "CANARY" else "LinearStepSize"] = size
    return {
        "EndpointName": "e",
        "EndpointConfigName": "new",
        "DeploymentConfig": {"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": routing}},
    }


@pytest.mark.parametrize(
    ("count", "size", "bad"),
    [
        (1, {"Type": "CAPACITY_PERCENT", "Value": 10}, True),  # one instance is 100 %
        (2, {"Type": "CAPACITY_PERCENT", "Value": 10}, False),
        (4, {"Type": "INSTANCE_COUNT", "Value": 2}, False),
        (4, {"Type": "INSTANCE_COUNT", "Value": 3}, True),
        (10, {"Type": "CAPACITY_PERCENT", "Value": 60}, True),
    ],
)
def test_a_canary_is_at_most_half_the_variant(count, size, bad):
    world = World(variants=[{"VariantName": "AllTraffic", "CurrentInstanceCount": count}])
    assert bool(refused("sagemaker", "UpdateEndpoint", update(size=size), world)) == bad
    assert not refused("sagemaker", "UpdateEndpoint", update("ALL_AT_ONCE"), world)


def test_a_scaled_variant_keeps_its_instance_type():
    live = [
        {"VariantName": "AllTraffic", "InstanceType": "ml.g5.xlarge", "CurrentInstanceCount": 2}
    ]
    new = [{"VariantName": "AllTraffic", "InstanceType": "ml.g6.xlarge"}]
    scaled = World(variants=live, config=new, scaled={"AllTraffic"})
    assert refused("sagemaker", "UpdateEndpoint", update("ALL_AT_ONCE"), scaled) == [
        "scaled-variant-instance-type"
    ]
    unscaled = World(variants=live, config=new)
    assert not refused("sagemaker", "UpdateEndpoint", update("ALL_AT_ONCE"), unscaled)


def test_sqs_event_sources():
    arn = "arn:aws:sqs:us-east-1:123456789012:q"
    mapping = {"EventSourceArn": arn, "FunctionName": "f", "BatchSize": 1000}
    assert refused("lambda", "CreateEventSourceMapping", mapping) == ["sqs-batch-window"]
    mapping["MaximumBatchingWindowInSeconds"] = 1
    assert not refused("lambda", "CreateEventSourceMapping", mapping)
    assert refused(
        "lambda", "CreateEventSourceMapping", mapping, World(visibility=30, timeout=60)
    ) == ["sqs-visibility-covers-timeout"]
    assert not refused(
        "lambda", "CreateEventSourceMapping", mapping, World(visibility=720, timeout=120)
    )


def test_scaling_bounds_and_neo_targets():
    target = {"MinCapacity": 4, "MaxCapacity": 1}
    assert refused("application-autoscaling", "RegisterScalableTarget", target)
    assert not refused(
        "application-autoscaling", "RegisterScalableTarget", {"MinCapacity": 1, "MaxCapacity": 4}
    )
    assert refused("sagemaker", "CreateCompilationJob", {"OutputConfig": {}})
    assert not refused(
        "sagemaker", "CreateCompilationJob", {"OutputConfig": {"TargetDevice": "ml_c5"}}
    )


def test_a_transform_jobs_model_takes_its_weights_from_one_model_data_url():
    """ModelDataSource (an uncompressed S3 prefix, the base of AdditionalModelDataSources) is
    refused for batch transform: a published adapter travels with its base in model.tar.gz."""
    job = {"TransformJobName": "j", "ModelName": "m"}
    tarball = World(containers=[{"Image": "i", "ModelDataUrl": "s3://b/model.tar.gz"}])
    assert not refused("sagemaker", "CreateTransformJob", job, tarball)
    prefix = {
        "S3DataSource": {"S3Uri": "s3://b/m/", "S3DataType": "S3Prefix", "CompressionType": "None"}
    }
    uncompressed = World(containers=[{"Image": "i", "ModelDataSource": prefix}])
    assert refused("sagemaker", "CreateTransformJob", job, uncompressed) == [
        "transform-model-data-source"
    ]
    assert not refused("sagemaker", "CreateTransformJob", job)  # unknown model: nothing said
