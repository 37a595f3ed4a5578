"""Run statemachine/retrain.asl.yaml, unchanged, in moto's Step Functions interpreter.

moto answers SageMaker at once (every job Completed, every endpoint InService) and lacks
UpdateEndpoint. `SimulatedSageMaker` plays the service's part: jobs go InProgress -> an outcome
after a few polls, training reports the metrics its container would log, UpdateEndpoint exists
and can be rolled back. It changes the simulated service only; the definition runs as deployed,
with the template's own DefinitionSubstitutions (deployment-specific values filled in), in the
interpreter the local stack runs (sluice_local.moto_fixes: the optimized SageMaker integration
with .sync, AWS's error names). Waits and retry back-offs take no time here (`fast_clock`).
"""

from __future__ import annotations

import importlib.util
import json
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import boto3
from moto.sagemaker.exceptions import ValidationError

from sluice_local import aws_rules
from sluice_local.sagemaker.quotas import CAPACITY_ERROR
from sluice_local.validation import message

REPO = Path(__file__).resolve().parents[1]
REGION = "us-east-1"
ACCOUNT = "123456789012"
STAGE = "test"
BUCKET = "sluice-test-data"
PARAM = "/sluice/test/current-model"
ENDPOINT = f"sluice-{STAGE}"
GROUP = f"sluice-{STAGE}"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/sluice-test-sagemaker"
DEFINITION = REPO / "statemachine/retrain.asl.yaml"
CHAMPION = f"sluice-{STAGE}-champion"
CHAMPION_DATA = f"s3://{BUCKET}/models/{CHAMPION}/output/model.tar.gz"


@cache
def _static_checks():
    spec = importlib.util.spec_from_file_location(
        "static_checks", REPO / "scripts/static_checks.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@cache
def _template_substitutions() -> tuple:
    checks = _static_checks()
    found = checks.state_machines(checks.load_template(REPO / "template.yaml"), REPO)
    return tuple(found[DEFINITION.resolve()].items())


def substitutions(**overrides) -> dict:
    """The template's DefinitionSubstitutions on its defaults, with this test deployment's names."""
    subs = dict(_template_substitutions())
    subs.update(
        Stage=STAGE,
        DataBucket=BUCKET,
        CurrentModelParameter=PARAM,
        ModelPackageGroup=GROUP,
        EndpointName=ENDPOINT,
        SageMakerRoleArn=ROLE,
        ImageUri=f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/sluice:1",
        DataKeyArn=f"arn:aws:kms:{REGION}:{ACCOUNT}:key/test",
        ErrorsAlarm="sluice-test-endpoint-5xx",
        LatencyAlarm="sluice-test-endpoint-latency",
        # waits take no time here (fast_clock); the settle bound counts them: 12 polls
        PollSeconds=60,
        DeploymentTimeoutSeconds=600,  # SageMaker's minimum
        RollbackAllowanceSeconds=120,
        TrainingTimeoutSeconds=20,
        CompileMaxPolls=6,
        # moto checks instance types against an older list than SageMaker's (no g5)
        EndpointInstanceType="ml.g4dn.xlarge",
        EndpointVariant=json.dumps(
            {
                "VariantName": "AllTraffic",
                "InstanceType": "ml.g4dn.xlarge",
                "InitialInstanceCount": 1,
                "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1",
            }
        ),
        EndpointVolumeKey="{}",  # g4dn has local storage: no volume key
    )
    subs.update(overrides)
    return subs


def definition(subs: dict) -> str:
    return _rendered(tuple(sorted(subs.items())))


@cache
def _rendered(subs: tuple) -> str:
    """The definition with these substitutions (rendered once per set: the fault sweep creates
    the same state machine 248 times)."""
    checks = _static_checks()
    text, missing = checks.render(DEFINITION.read_text(), dict(subs))
    assert not missing, missing
    return text


class MotoWorld(aws_rules.Unknown):
    """What sluice_local.aws_rules may ask, answered from moto's backends."""

    def __init__(self, backend):
        self.backend = backend

    def config_variants(self, config: str) -> list[dict] | None:
        found = self.backend.endpoint_configs.get(config)
        return None if found is None else found.production_variants

    def endpoint_variants(self, endpoint: str) -> list[dict] | None:
        ep = self.backend.endpoints.get(endpoint)
        if ep is None:
            return None
        types = {
            v["VariantName"]: v.get("InstanceType")
            for v in self.config_variants(ep.endpoint_config_name) or []
        }
        return [{**v, "InstanceType": types.get(v["VariantName"])} for v in ep.production_variants]

    def scaled_variants(self, endpoint: str) -> set[str]:
        return aws_rules.moto_scaled_variants(endpoint)


@dataclass
class SimulatedSageMaker:
    """Outcomes the next jobs and deployments reach, and after how many polls."""

    training: str = "Completed"  # Completed | Failed | InProgress (never finishes)
    # CreateTrainingJob calls answered ResourceLimitExceeded before one is accepted
    quota_refusals: int = 0
    # training jobs created and then failed because SageMaker found no instances for them
    capacity_failures: int = 0
    metrics: dict = field(default_factory=lambda: {"gate_challenger": 40.0})
    training_failure: str = "AlgorithmError: CUDA out of memory"
    deployment: str = "InService"  # InService | RolledBack | Failed
    compilation: str = "COMPLETED"  # COMPLETED | FAILED
    # a tuning job's trials: each one's metrics (validation_loss is the objective); the job
    # ends Failed when no trial has the objective
    trials: list = field(
        default_factory=lambda: [
            {"validation_loss": 3.5, "gate_challenger": 40.0},
            {"validation_loss": 3.1, "gate_challenger": 30.0},
        ]
    )
    tunings: list = field(default_factory=list)  # CreateHyperParameterTuningJob requests
    tuning: str = "Completed"  # Completed (as its trials make it) | InProgress (never finishes)
    polls: int = 2
    updates: list = field(default_factory=list)  # UpdateEndpoint requests, as sent
    _seen: dict = field(default_factory=dict)

    def install(self, monkeypatch) -> None:
        from moto.sagemaker.models import SageMakerModelBackend
        from moto.sagemaker.responses import SageMakerResponse

        from sluice_local.moto_fixes import backend_patches, interpreter_patches

        sim = self
        for owner, name, value in interpreter_patches() + backend_patches():
            monkeypatch.setattr(owner, name, value, raising=False)
        fast_clock(monkeypatch)
        parse_once(monkeypatch)

        create_training = SageMakerModelBackend.create_training_job
        describe_training = SageMakerModelBackend.describe_training_job

        def create_training_job(backend, *args, **kwargs):
            if sim.quota_refusals > 0:
                from moto.core.exceptions import JsonRESTError

                sim.quota_refusals -= 1
                raise JsonRESTError(
                    "ResourceLimitExceeded",
                    "The account-level service limit 'ml.g5.xlarge for training job usage' is 1 "
                    "Instances, with current utilization of 1 Instances and a request delta of 1 "
                    "Instances. Please contact AWS support to request an increase for this limit.",
                )
            job = create_training(backend, *args, **kwargs)
            job.training_job_status, job.secondary_status = "InProgress", "Training"
            job.final_metric_data_list = []
            if sim.capacity_failures > 0:
                sim.capacity_failures -= 1
                job.training_job_status = job.secondary_status = "Failed"
                job.failure_reason = CAPACITY_ERROR
            return job

        def describe_training_job(backend, name):
            job = backend.training_jobs[name]
            if sim._tick(("training", name)) and job.training_job_status == "InProgress":
                if sim.training == "Completed":
                    job.training_job_status = job.secondary_status = "Completed"
                    job.final_metric_data_list = [
                        {"MetricName": k, "Value": float(v), "Timestamp": job.creation_time}
                        for k, v in sim.metrics.items()
                    ]
                elif sim.training == "Failed":
                    job.training_job_status = job.secondary_status = "Failed"
                    job.failure_reason = sim.training_failure
            return describe_training(backend, name)

        create_tuning = SageMakerModelBackend.create_hyper_parameter_tuning_job
        describe_tuning = SageMakerModelBackend.describe_hyper_parameter_tuning_job

        def create_hyper_parameter_tuning_job(backend, *args, **kwargs):
            answer = create_tuning(backend, *args, **kwargs)
            job = backend.hyper_parameter_tuning_jobs[kwargs["hyper_parameter_tuning_job_name"]]
            job.hyper_parameter_tuning_job_status = "InProgress"
            sim.tunings.append(kwargs)
            return answer

        def describe_hyper_parameter_tuning_job(backend, hyper_parameter_tuning_job_name):
            name = hyper_parameter_tuning_job_name
            job = backend.hyper_parameter_tuning_jobs[name]
            if (
                sim._tick(("tuning", name))
                and job.hyper_parameter_tuning_job_status == "InProgress"
                and sim.tuning == "Completed"
            ):
                sim._run_trials(backend, job)
            return describe_tuning(backend, name)

        create_endpoint = SageMakerModelBackend.create_endpoint
        describe_endpoint = SageMakerModelBackend.describe_endpoint

        def create_endpoint_(backend, endpoint_name, endpoint_config_name, tags):
            ep = create_endpoint(backend, endpoint_name, endpoint_config_name, tags)
            ep.endpoint_status = "Creating"
            ep._target = endpoint_config_name
            return ep

        def update_endpoint(backend, endpoint_name, endpoint_config_name, request):
            ep = backend.endpoints[endpoint_name]
            backend.describe_endpoint_config(endpoint_config_name)  # must exist
            # SageMaker's documented rules that depend on the live fleet (canary size, scaled
            # variants): refused as the local SageMaker refuses them
            found = aws_rules.problems("sagemaker", "UpdateEndpoint", request, MotoWorld(backend))
            if found:
                raise ValidationError(message=message(found))
            sim.updates.append(request)
            ep.endpoint_status, ep._target = "Updating", endpoint_config_name
            sim._seen.pop(("endpoint", endpoint_name), None)
            return ep

        def describe_endpoint_(backend, endpoint_name):
            ep = backend.endpoints.get(endpoint_name)
            target = getattr(ep, "_target", None)
            if ep is not None and target and sim._tick(("endpoint", endpoint_name)):
                ep._target = None
                if sim.deployment == "Failed":
                    ep.endpoint_status, ep.failure_reason = "Failed", "container failed /ping"
                elif sim.deployment == "RolledBack" and ep.endpoint_status == "Updating":
                    ep.endpoint_status = "InService"
                    ep.failure_reason = "alarm sluice-test-endpoint-5xx went off during baking"
                else:
                    ep.endpoint_status, ep.endpoint_config_name = "InService", target
            return describe_endpoint(backend, endpoint_name)

        def update_endpoint_response(response):
            ep = response.sagemaker_backend.update_endpoint(
                response._get_param("EndpointName"),
                response._get_param("EndpointConfigName"),
                json.loads(response.body),
            )
            return json.dumps({"EndpointArn": ep.arn})

        create_compilation = SageMakerModelBackend.create_compilation_job

        def create_compilation_job(backend, compilation_job_name, *args, **kwargs):
            arn = create_compilation(backend, compilation_job_name, *args, **kwargs)
            job = backend.compilation_jobs[compilation_job_name]
            if sim.compilation == "FAILED":
                job.compilation_job_status = "FAILED"
                job.failure_reason = "ClientError: TVM could not lower aten::scaled_dot_product"
            return arn

        update_package = SageMakerModelBackend.update_model_package

        def update_model_package(backend, **kwargs):
            # moto drops the metadata an update does not mention; SageMaker keeps it
            arn = kwargs["model_package_arn"]
            name = backend.model_package_name_mapping.get(arn, arn)
            kept = backend.model_packages[name].customer_metadata_properties
            kwargs["customer_metadata_properties"] = kwargs["customer_metadata_properties"] or kept
            return update_package(backend, **kwargs)

        for name, fn in {
            "update_model_package": update_model_package,
            "create_training_job": create_training_job,
            "create_hyper_parameter_tuning_job": create_hyper_parameter_tuning_job,
            "describe_hyper_parameter_tuning_job": describe_hyper_parameter_tuning_job,
            "describe_training_job": describe_training_job,
            "create_endpoint": create_endpoint_,
            "describe_endpoint": describe_endpoint_,
            "update_endpoint": update_endpoint,
            "create_compilation_job": create_compilation_job,
        }.items():
            monkeypatch.setattr(SageMakerModelBackend, name, fn, raising=False)
        monkeypatch.setattr(
            SageMakerResponse, "update_endpoint", update_endpoint_response, raising=False
        )

    def _run_trials(self, backend, tuning) -> None:
        """The tuning job's trials, as the service would have run them: one Completed training
        job per entry of `trials` (Failed when it lacks the objective), the best by the lowest
        validation_loss."""
        d = tuning.training_job_definition
        summaries = []
        for i, metrics in enumerate(self.trials):
            name = f"{tuning.hyper_parameter_tuning_job_name}-{i + 1:03d}-0000000{i}"
            tuned = {"learning_rate": str(10 ** -(3 + i)), "warmup_steps": str(10 * i)}
            job = backend.create_training_job(
                training_job_name=name,
                hyper_parameters={**d.get("StaticHyperParameters", {}), **tuned},
                algorithm_specification=d["AlgorithmSpecification"],
                role_arn=d["RoleArn"],
                input_data_config=d["InputDataConfig"],
                output_data_config=d["OutputDataConfig"],
                resource_config=d["ResourceConfig"],
                vpc_config=d.get("VpcConfig"),
                stopping_condition=d["StoppingCondition"],
                tags=[],
                enable_network_isolation=False,
                enable_inter_container_traffic_encryption=True,
                enable_managed_spot_training=d.get("EnableManagedSpotTraining", False),
                checkpoint_config=d.get("CheckpointConfig"),
                debug_hook_config=None,
                debug_rule_configurations=None,
                tensor_board_output_config=None,
                experiment_config=None,
            )
            ok = "validation_loss" in metrics
            job.training_job_status = job.secondary_status = "Completed" if ok else "Failed"
            job.final_metric_data_list = [
                {"MetricName": k, "Value": float(v), "Timestamp": job.creation_time}
                for k, v in metrics.items()
            ]
            if ok:
                summaries.append(
                    {
                        "TrainingJobName": name,
                        "TrainingJobArn": job.arn,
                        "CreationTime": job.creation_time,
                        "TrainingJobStatus": "Completed",
                        "TunedHyperParameters": tuned,
                        "FinalHyperParameterTuningJobObjectiveMetric": {
                            "MetricName": "validation_loss",
                            "Value": float(metrics["validation_loss"]),
                        },
                        "ObjectiveStatus": "Succeeded",
                    }
                )
        n, done = len(self.trials), len(summaries)
        tuning.training_job_status_counters = {
            "Completed": done,
            "InProgress": 0,
            "RetryableError": 0,
            "NonRetryableError": n - done,
            "Stopped": 0,
        }
        tuning.objective_status_counters = {"Succeeded": done, "Pending": 0, "Failed": n - done}
        if summaries:
            tuning.hyper_parameter_tuning_job_status = "Completed"
            tuning.best_training_job = min(
                summaries,
                key=lambda s: s["FinalHyperParameterTuningJobObjectiveMetric"]["Value"],
            )
        else:
            tuning.hyper_parameter_tuning_job_status = "Failed"
            tuning.failure_reason = "No training job reported the objective metric validation_loss"
            tuning.best_training_job = None

    def _tick(self, key) -> bool:
        """Count one poll; True once this job has been polled enough to reach its outcome."""
        self._seen[key] = self._seen.get(key, 0) + 1
        return self._seen[key] >= self.polls


def world(monkeypatch, **overrides):
    """A fresh moto world with the simulated SageMaker and the state machine (template
    substitutions overridden by `overrides`), for a fixture to yield from."""
    from moto import mock_aws

    aws_env(monkeypatch)
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        sim = SimulatedSageMaker()
        sim.install(monkeypatch)
        w = create_world()
        w["sim"] = sim
        w["arn"] = create_state_machine(w, **overrides)
        yield w


def aws_env(monkeypatch) -> None:
    """The region and stand-in credentials every client in these tests uses."""
    for k, v in {
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }.items():
        monkeypatch.setenv(k, v)


def fast_clock(monkeypatch) -> None:
    """Wait states, retry back-offs and .sync polls return at once; the definition's own counts
    (settle bound, poll limits) still run their course."""
    import types

    from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
        state_task_service_callback,
    )
    from moto.stepfunctions.parser.asl.component.state.wait.wait_function.wait_function import (
        WaitFunction,
    )

    monkeypatch.setattr(retrier_decl, "time", types.SimpleNamespace(sleep=lambda s: None))
    monkeypatch.setattr(WaitFunction, "_wait_interval", lambda self, env, wait_seconds: None)
    monkeypatch.setattr(state_task_service_callback, "_DELAY_SECONDS_SYNC_CONDITION_CHECK", 0.01)


_PARSED: dict[str, tuple] = {}


def parse_once(monkeypatch) -> None:
    """moto's interpreter parses a definition at creation and again at each execution (~1 s of
    ANTLR each for this one); runs of the same text share one parse. The parsed program holds no
    execution state: each execution gets its own environment."""
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser

    parse = AmazonStateLanguageParser.parse

    def cached(definition: str):
        if definition not in _PARSED:
            _PARSED[definition] = parse(definition)
        return _PARSED[definition]

    monkeypatch.setattr(AmazonStateLanguageParser, "parse", staticmethod(cached))


@cache
def client(service: str):
    """One client per service for the whole run (moto's stub serves every mock it is used in):
    creating one costs ~25 ms, and the fault sweep made 14 per execution."""
    return boto3.client(service, region_name=REGION)


def create_world(sns_queue: bool = True) -> dict:
    """The resources the template would create that the state machine touches."""
    s3 = client("s3")
    s3.create_bucket(Bucket=BUCKET)
    client("ssm").put_parameter(Name=PARAM, Value="none", Type="String")
    client("sagemaker").create_model_package_group(ModelPackageGroupName=GROUP)
    sns = client("sns")
    topic = sns.create_topic(Name="sluice-test-notifications")["TopicArn"]
    world = {"topic": topic}
    if sns_queue:
        sqs = client("sqs")
        url = sqs.create_queue(QueueName="notifications")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        sns.subscribe(
            TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"}
        )
        world["queue"] = url
    return world


def install_champion(instances: int = 2, instance_type: str = "ml.g4dn.xlarge") -> None:
    """A champion serving on the endpoint, as a previous promotion leaves it (two instances: a
    canary of 10% is one of them)."""
    sm = client("sagemaker")
    sm.create_model(
        ModelName=CHAMPION,
        ExecutionRoleArn=ROLE,
        PrimaryContainer={"Image": "img", "ModelDataUrl": CHAMPION_DATA},
    )
    variant = {
        "VariantName": "AllTraffic",
        "ModelName": CHAMPION,
        "InstanceType": instance_type,
        "InitialInstanceCount": instances,
    }
    sm.create_endpoint_config(EndpointConfigName=CHAMPION, ProductionVariants=[variant])
    sm.create_endpoint(EndpointName=ENDPOINT, EndpointConfigName=CHAMPION)
    sm.describe_endpoint(EndpointName=ENDPOINT)  # the simulated creation completes
    sm.describe_endpoint(EndpointName=ENDPOINT)
    client("ssm").put_parameter(Name=PARAM, Value=CHAMPION, Type="String", Overwrite=True)


def create_state_machine(world: dict, name: str = f"sluice-{STAGE}-retrain", **overrides) -> str:
    subs = substitutions(NotificationTopicArn=world["topic"], **overrides)
    return client("stepfunctions").create_state_machine(
        name=name,
        definition=definition(subs),
        roleArn=f"arn:aws:iam::{ACCOUNT}:role/sluice-test-retrain",
    )["stateMachineArn"]


def run(arn: str, name: str, doc: dict, timeout_s: float = 60) -> dict:
    """Start an execution and wait for it to end; return describe_execution's answer."""
    sfn = client("stepfunctions")
    ex = sfn.start_execution(stateMachineArn=arn, name=name, input=json.dumps(doc))["executionArn"]
    execution = _moto_execution(arn, ex)
    deadline = time.monotonic() + timeout_s
    # the execution runs on moto's thread: watch its status in memory rather than through the
    # API, whose every call holds the GIL for ~20 ms and halved the interpreter's speed
    while time.monotonic() < deadline:
        if execution.exec_status is not None and execution.exec_status.value != "RUNNING":
            return sfn.describe_execution(executionArn=ex)
        time.sleep(0.005)
    raise AssertionError(f"execution {name} still running after {timeout_s} s")


def _moto_execution(machine_arn: str, execution_arn: str):
    """moto's in-memory Execution behind an ARN (the interpreter's, with its live status)."""
    from moto.stepfunctions.parser.models import stepfunctions_parser_backends

    backend = stepfunctions_parser_backends[ACCOUNT][REGION]
    machine = backend.describe_state_machine(machine_arn)
    return next(e for e in machine.executions if e.execution_arn == execution_arn)


def calls(execution_arn: str) -> list[str]:
    """The service calls the execution made, in order (from its own history)."""
    sfn = client("stepfunctions")
    events = sfn.get_execution_history(executionArn=execution_arn, maxResults=1000)["events"]
    out = []
    for e in events:
        d = e.get("taskScheduledEventDetails")
        if d:
            service = d["resourceType"].removeprefix("aws-sdk:")
            out.append(f"{service}:{d['resource']}")
    return out


def notifications(world: dict) -> list[dict]:
    sqs = client("sqs")
    out = []
    while True:
        msgs = sqs.receive_message(QueueUrl=world["queue"], MaxNumberOfMessages=10).get(
            "Messages", []
        )
        if not msgs:
            return out
        out += [json.loads(m["Body"]) for m in msgs]


def explain(d: dict) -> str:
    """An execution's end for assertion messages: status, error, cause, states it went through."""
    sfn = client("stepfunctions")
    events = sfn.get_execution_history(executionArn=d["executionArn"], maxResults=1000)["events"]
    states = [
        e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e
    ]
    return f"{d['status']} {d.get('error')}: {d.get('cause')}\nstates: {' > '.join(states)}"
