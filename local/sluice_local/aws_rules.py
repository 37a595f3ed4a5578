"""AWS's rules that the service models do not carry: the ones its documents state in prose.

`sluice_local.validation` checks what botocore's service models say (patterns, lengths, ranges,
enums). AWS refuses more than that: the API reference's notes on a field, combinations of fields,
limits that depend on the instance type or on what already exists. Each rule here is one such
sentence, with the document it comes from; the local SageMaker, the local deployer (Lambda's
event source mappings) and every strict client (`validation.strict_clients`, the `strict_aws`
tests) refuse a request that breaks one, as AWS would.

A rule that needs to know what exists (an endpoint's instance count, a scalable target) asks the
`World` it is given; checked without one (a client-side check), it says nothing.

`python -m sluice_local.aws_rules` prints the table (rule, operation, source) that docs/local.md
carries; a test keeps the two equal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from sluice_functions.instances import has_local_storage

SAGEMAKER_API = "https://docs.aws.amazon.com/sagemaker/latest/APIReference"
LAMBDA_API = "https://docs.aws.amazon.com/lambda/latest/api"
LAMBDA_DG = "https://docs.aws.amazon.com/lambda/latest/dg"
SAGEMAKER_DG = "https://docs.aws.amazon.com/sagemaker/latest/dg"
AUTOSCALING_API = "https://docs.aws.amazon.com/autoscaling/application/APIReference"
CLOUDWATCH_API = "https://docs.aws.amazon.com/AmazonCloudWatch/latest/APIReference"


class World(Protocol):
    """What a stateful rule may ask about resources that already exist (None: unknown)."""

    def endpoint_variants(self, endpoint: str) -> list[dict] | None:
        """The endpoint's current variants: VariantName, InstanceType, CurrentInstanceCount."""

    def config_variants(self, config: str) -> list[dict] | None:
        """An endpoint config's ProductionVariants."""

    def scaled_variants(self, endpoint: str) -> set[str] | None:
        """Variants of the endpoint registered as Application Auto Scaling targets."""

    def queue_visibility_timeout(self, queue_arn: str) -> int | None: ...

    def function_timeout(self, function: str) -> int | None: ...

    def model_containers(self, model: str) -> list[dict] | None:
        """A model's container definitions (PrimaryContainer, or Containers)."""


class Unknown:
    """A World that knows nothing: a place that knows some of it overrides those answers."""

    def endpoint_variants(self, endpoint: str) -> list[dict] | None:
        return None

    def config_variants(self, config: str) -> list[dict] | None:
        return None

    def scaled_variants(self, endpoint: str) -> set[str] | None:
        return None

    def queue_visibility_timeout(self, queue_arn: str) -> int | None:
        return None

    def function_timeout(self, function: str) -> int | None:
        return None

    def model_containers(self, model: str) -> list[dict] | None:
        return None


Check = Callable[[dict, "World | None"], "str | None"]


def moto_scaled_variants(endpoint: str) -> set[str]:
    """`World.scaled_variants` from moto's Application Auto Scaling (this process's)."""
    from moto.applicationautoscaling.models import applicationautoscaling_backends

    from . import ACCOUNT, REGION

    targets = applicationautoscaling_backends[ACCOUNT][REGION].targets.get(
        "sagemaker:variant:DesiredInstanceCount", {}
    )
    prefix = f"endpoint/{endpoint}/variant/"
    return {rid[len(prefix) :] for rid in targets if rid.startswith(prefix)}


@dataclass(frozen=True)
class Rule:
    id: str
    service: str
    operations: tuple[str, ...]
    source: str  # the document that states it
    check: Check  # the request (and what exists) -> AWS's refusal, or None

    def __call__(self, params: dict, world: World | None = None) -> str | None:
        return self.check(params, world)


RULES: list[Rule] = []


def rule(id: str, service: str, operations: tuple[str, ...] | str, source: str):
    """Register a check as a rule of the set."""
    ops = (operations,) if isinstance(operations, str) else operations

    def register(check: Check) -> Check:
        RULES.append(Rule(id, service, ops, source, check))
        return check

    return register


def problems(service: str, operation: str, params: dict, world: World | None = None) -> list[str]:
    """Each documented rule `params` breaks, in AWS's words, prefixed by the rule's id."""
    out = []
    for r in RULES:
        if r.service == service and operation in r.operations:
            said = r(params, world)
            if said:
                out.append(f"{said} [{r.id}]")
    return out


# --- volume keys and instance storage -----------------------------------------------------------

LOCAL_STORAGE_NOTE = (
    "Certain Nitro-based instances include local storage ... You can't request a {field} when "
    "using an instance type with local storage"
)


def _refused_volume_key(configs) -> str | None:
    """The refusal for the first resource config that asks for a volume key on an instance type
    with local storage."""
    for config in configs:
        if config.get("VolumeKmsKeyId"):
            found = _local_storage("VolumeKmsKeyId", config.get("InstanceType"))
            if found:
                return found
    return None


def _local_storage(field: str, instance_type: str | None) -> str | None:
    if instance_type and has_local_storage(instance_type):
        return (
            f"{field} is not supported for instance type {instance_type}, which has local "
            f"instance storage (encrypted by a hardware module on the instance). "
            + LOCAL_STORAGE_NOTE.format(field=field)
        )
    return None


@rule(
    "volume-key-transform",
    "sagemaker",
    "CreateTransformJob",
    f"{SAGEMAKER_API}/API_TransformResources.html (VolumeKmsKeyId)",
)
def _transform_volume_key(p: dict, world) -> str | None:
    return _refused_volume_key([p.get("TransformResources") or {}])


@rule(
    "transform-model-data-source",
    "sagemaker",
    "CreateTransformJob",
    f"{SAGEMAKER_API}/API_ContainerDefinition.html (ModelDataSource)",
)
def _transform_model_data_source(p: dict, world) -> str | None:
    # Why a retrained LoRA adapter cannot be published for batch work without its base: a transform
    # job's model takes its weights from ModelDataUrl (one model.tar.gz) only; an uncompressed S3
    # prefix or an extra data source (AdditionalModelDataSources) needs ModelDataSource.
    containers = world.model_containers(p.get("ModelName", "")) if world else None
    for c in containers or []:
        if c.get("ModelDataSource"):
            return (
                f"Model {p.get('ModelName')} uses ModelDataSource: currently you cannot use "
                "ModelDataSource in conjunction with SageMaker batch transform; give the model a "
                "ModelDataUrl (one model.tar.gz) for transform jobs"
            )
    return None


def _clusters(p: dict) -> Iterator[dict]:
    yield (p.get("ProcessingResources") or {}).get("ClusterConfig") or {}
    job = (p.get("MonitoringScheduleConfig") or {}).get("MonitoringJobDefinition") or {}
    yield (job.get("MonitoringResources") or {}).get("ClusterConfig") or {}


@rule(
    "volume-key-processing",
    "sagemaker",
    ("CreateProcessingJob", "CreateMonitoringSchedule", "UpdateMonitoringSchedule"),
    f"{SAGEMAKER_API}/API_ProcessingClusterConfig.html (VolumeKmsKeyId)",
)
def _processing_volume_key(p: dict, world) -> str | None:
    return _refused_volume_key(_clusters(p))


def _training_definitions(p: dict) -> Iterator[dict]:
    if "ResourceConfig" in p:
        yield p
    if p.get("TrainingJobDefinition"):
        yield p["TrainingJobDefinition"]
    yield from p.get("TrainingJobDefinitions") or []


@rule(
    "volume-key-training",
    "sagemaker",
    ("CreateTrainingJob", "CreateHyperParameterTuningJob"),
    f"{SAGEMAKER_API}/API_ResourceConfig.html (VolumeKmsKeyId)",
)
def _training_volume_key(p: dict, world) -> str | None:
    return _refused_volume_key(d.get("ResourceConfig") or {} for d in _training_definitions(p))


@rule(
    "volume-key-endpoint",
    "sagemaker",
    "CreateEndpointConfig",
    f"{SAGEMAKER_API}/API_CreateEndpointConfig.html (KmsKeyId)",
)
def _endpoint_volume_key(p: dict, world) -> str | None:
    if not p.get("KmsKeyId"):
        return None
    for v in p.get("ProductionVariants") or []:
        found = _local_storage("KmsKeyId", v.get("InstanceType"))
        if found:
            return found + (
                ". If you specify a value for KmsKeyId when using any nitro-based instances "
                "with local storage, the call to CreateEndpointConfig fails"
            )
    return None


# --- transform jobs ------------------------------------------------------------------------------


@rule(
    "transform-payload-times-concurrency",
    "sagemaker",
    "CreateTransformJob",
    f"{SAGEMAKER_API}/API_CreateTransformJob.html (MaxPayloadInMB)",
)
def _payload_times_concurrency(p: dict, world) -> str | None:
    payload, concurrent = p.get("MaxPayloadInMB"), p.get("MaxConcurrentTransforms")
    if payload and concurrent and payload * concurrent > 100:
        return (
            f"MaxConcurrentTransforms ({concurrent}) * MaxPayloadInMB ({payload}) = "
            f"{concurrent * payload} MB: if you specify the MaxConcurrentTransforms parameter, "
            "the value of (MaxConcurrentTransforms * MaxPayloadInMB) also cannot exceed 100 MB"
        )
    return None


# --- training ------------------------------------------------------------------------------------


@rule(
    "spot-max-wait",
    "sagemaker",
    ("CreateTrainingJob", "CreateHyperParameterTuningJob"),
    f"{SAGEMAKER_API}/API_StoppingCondition.html (MaxWaitTimeInSeconds)",
)
def _spot_wait(p: dict, world) -> str | None:
    for d in _training_definitions(p):
        stop = d.get("StoppingCondition") or {}
        wait, run = stop.get("MaxWaitTimeInSeconds"), stop.get("MaxRuntimeInSeconds")
        if d.get("EnableManagedSpotTraining"):
            if wait is None:
                return "Managed spot training requires StoppingCondition.MaxWaitTimeInSeconds"
            if run is not None and wait < run:
                return (
                    f"MaxWaitTimeInSeconds ({wait}) must be equal to or greater than "
                    f"MaxRuntimeInSeconds ({run})"
                )
        elif wait is not None:
            return "MaxWaitTimeInSeconds is only valid with EnableManagedSpotTraining"
    return None


# --- endpoints -----------------------------------------------------------------------------------


def _size_in_instances(size: dict, count: int) -> float:
    """A CapacitySize as instances: a capacity percentage is at least one instance."""
    if size.get("Type") == "INSTANCE_COUNT":
        return float(size.get("Value", 0))
    return max(1.0, math.ceil(count * size.get("Value", 0) / 100))


@rule(
    "canary-at-most-half",
    "sagemaker",
    "UpdateEndpoint",
    f"{SAGEMAKER_API}/API_TrafficRoutingConfig.html (CanarySize, LinearStepSize)",
)
def _canary_size(p: dict, world) -> str | None:
    routing = (
        ((p.get("DeploymentConfig") or {}).get("BlueGreenUpdatePolicy") or {}).get(
            "TrafficRoutingConfiguration"
        )
    ) or {}
    kind = routing.get("Type")
    size = routing.get("CanarySize" if kind == "CANARY" else "LinearStepSize")
    if kind not in ("CANARY", "LINEAR") or not size:
        return None
    field = "CanarySize" if kind == "CANARY" else "LinearStepSize"
    bound = "less than or equal to 50%" if kind == "CANARY" else "10-50%"
    if size.get("Type") == "CAPACITY_PERCENT" and size.get("Value", 0) > 50:
        return f"{field} must be {bound} of the variant's total instance count"
    variants = world.endpoint_variants(p.get("EndpointName", "")) if world else None
    for v in variants or []:
        count = int(v.get("CurrentInstanceCount") or v.get("InitialInstanceCount") or 0)
        if count and _size_in_instances(size, count) > count / 2:
            return (
                f"{field} must be {bound} of the variant's total instance count: variant "
                f"{v.get('VariantName')} has {count} instance(s)"
            )
    return None


@rule(
    "scaled-variant-instance-type",
    "sagemaker",
    "UpdateEndpoint",
    f"{SAGEMAKER_DG}/endpoint-auto-scaling-delete.html (update an endpoint that uses automatic "
    "scaling)",
)
def _scaled_instance_type(p: dict, world) -> str | None:
    if not world:
        return None
    new_types = {
        v.get("VariantName"): v.get("InstanceType")
        for v in world.config_variants(p.get("EndpointConfigName", "")) or []
    }
    scaled = world.scaled_variants(p.get("EndpointName", "")) or set()
    for v in world.endpoint_variants(p.get("EndpointName", "")) or []:
        name = v.get("VariantName")
        if name in scaled and name in new_types and new_types[name] != v.get("InstanceType"):
            return (
                f"The instance type of variant {name} cannot change ({v.get('InstanceType')} -> "
                f"{new_types[name]}) while it is registered as a scalable target: deregister it "
                "from Application Auto Scaling before the update"
            )
    return None


# --- Application Auto Scaling --------------------------------------------------------------------


@rule(
    "scaling-min-at-most-max",
    "application-autoscaling",
    "RegisterScalableTarget",
    f"{AUTOSCALING_API}/API_RegisterScalableTarget.html (MaxCapacity)",
)
def _min_max(p: dict, world) -> str | None:
    low, high = p.get("MinCapacity"), p.get("MaxCapacity")
    if low is not None and high is not None and low > high:
        return f"MinCapacity ({low}) cannot be greater than MaxCapacity ({high})"
    return None


# --- Lambda event source mappings ----------------------------------------------------------------


@rule(
    "sqs-batch-window",
    "lambda",
    ("CreateEventSourceMapping", "UpdateEventSourceMapping"),
    f"{LAMBDA_API}/API_CreateEventSourceMapping.html (BatchSize)",
)
def _batch_window(p: dict, world) -> str | None:
    size, window = p.get("BatchSize"), p.get("MaximumBatchingWindowInSeconds") or 0
    if ":sqs:" in p.get("EventSourceArn", ":sqs:") and size and size > 10 and window < 1:
        return (
            f"BatchSize {size}: when you set BatchSize to a value greater than 10, you must set "
            "MaximumBatchingWindowInSeconds to at least 1"
        )
    return None


@rule(
    "sqs-visibility-covers-timeout",
    "lambda",
    ("CreateEventSourceMapping", "UpdateEventSourceMapping"),
    f"{LAMBDA_DG}/services-sqs-configure.html (queue visibility timeout)",
)
def _visibility(p: dict, world) -> str | None:
    arn = p.get("EventSourceArn", "")
    if not world or ":sqs:" not in arn:
        return None
    visibility = world.queue_visibility_timeout(arn)
    timeout = world.function_timeout(p.get("FunctionName", ""))
    if visibility is not None and timeout is not None and visibility < timeout:
        return (
            f"Queue visibility timeout: {visibility} seconds is less than Function timeout: "
            f"{timeout} seconds"
        )
    return None


# --- compilation ---------------------------------------------------------------------------------


@rule(
    "neo-device-or-platform",
    "sagemaker",
    "CreateCompilationJob",
    f"{SAGEMAKER_API}/API_OutputConfig.html (TargetDevice, TargetPlatform)",
)
def _device_or_platform(p: dict, world) -> str | None:
    out = p.get("OutputConfig") or {}
    if bool(out.get("TargetDevice")) == bool(out.get("TargetPlatform")):
        return "OutputConfig needs exactly one of TargetDevice or TargetPlatform"
    return None


# --- CloudWatch dashboards ------------------------------------------------------------------------

WIDGET_TYPES = ("metric", "text", "log", "alarm", "explorer")


@rule(
    "dashboard-body",
    "cloudwatch",
    "PutDashboard",
    f"{CLOUDWATCH_API}/CloudWatch-Dashboard-Body-Structure.html",
)
def _dashboard_body(p: dict, world) -> str | None:
    import json

    try:
        body = json.loads(p.get("DashboardBody", ""))
    except ValueError as e:
        return f"The field DashboardBody must be a valid JSON object: {e}"
    widgets = body.get("widgets") if isinstance(body, dict) else None
    if not isinstance(widgets, list) or len(widgets) > 500:
        return "The dashboard must include a widgets array of between 0 and 500 widget objects"
    for i, w in enumerate(widgets):
        where, props = f"widgets[{i}]", w.get("properties") or {}
        if w.get("type") not in WIDGET_TYPES:
            return f"{where}: type must be one of {', '.join(WIDGET_TYPES)}"
        if not 1 <= w.get("width", 6) <= 24 or not 1 <= w.get("height", 6) <= 1000:
            return f"{where}: width is 1 to 24 and height 1 to 1000 grid units"
        if not 0 <= w.get("x", 0) <= 23:
            return f"{where}: x is 0 to 23"
        if w["type"] == "text" and not isinstance(props.get("markdown"), str):
            return f"{where}: a text widget needs properties.markdown"
        if w["type"] == "metric":
            said = _metric_widget(props)
            if said:
                return f"{where}: {said}"
    return None


def _metric_widget(props: dict) -> str | None:
    if not props.get("region"):
        return "a metric widget needs properties.region"
    period = props.get("period", 300)
    if period not in (1, 5, 10, 30) and (period < 60 or period % 60):
        return f"period {period}: valid values are 1, 5, 10, 30, and any multiple of 60"
    for row in props.get("metrics") or []:
        if len(row) == 1 and isinstance(row[0], dict) and "expression" in row[0]:
            continue  # metric math
        names = [x for x in row if isinstance(x, str)]
        if not row or any(isinstance(x, dict) for x in row[:-1]) or len(names) < 2:
            return (
                f"metric {row}: Namespace, MetricName, then dimension name/value pairs, then "
                "an optional rendering object"
            )
        if len(names) % 2:
            return f"metric {row}: each dimension name needs its value"
    return None


def table() -> str:
    """The rule set as a Markdown table (docs/local.md carries it)."""
    rows = ["| rule | operation | source |", "|---|---|---|"]
    for r in RULES:
        ops = ", ".join(f"{r.service}:{op}" for op in r.operations)
        rows.append(f"| `{r.id}` | {ops} | {r.source} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
