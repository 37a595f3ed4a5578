"""Where moto's Step Functions interpreter differs from Step Functions, and the local fix.

Each entry names the difference; none changes what a definition means.
"""

from __future__ import annotations

import copy
import functools
import json
import sys
import threading
import time
from types import SimpleNamespace

# aws-sdk task ARNs name Application Auto Scaling `applicationautoscaling`; boto3 knows it as
# `application-autoscaling`, and moto's interpreter maps only some services' names.
SFN_SERVICE_NAMES = {"applicationautoscaling": "application-autoscaling"}

# Step Functions names an aws-sdk error `ServiceName.ErrorName`, both PascalCase, the error name
# given an `Exception` suffix when it lacks one (developer guide, "AWS SDK service integrations"),
# for the errors the service's API models; an error it does not model (SageMaker models none of
# throttling, validation or internal failures) reaches the state as `ServiceName.ServiceName
# Exception`, e.g. `SageMaker.SageMakerException`. moto's interpreter names it
# `sagemaker.sagemakerException`. The service names are the AWS SDKs' (AcmPca, DynamoDb, Ssm).
SFN_ERROR_SERVICE_NAMES = {
    "applicationautoscaling": "ApplicationAutoScaling",
    "dynamodb": "DynamoDb",
    "sagemaker": "SageMaker",
    "sfn": "Sfn",
    "sns": "Sns",
    "sqs": "Sqs",
    "ssm": "Ssm",
    "s3": "S3",
}

# Step Functions' optimized SageMaker integration: these actions, `.sync` for the jobs
# (developer guide, "Create and manage Amazon SageMaker AI jobs with Step Functions").
SAGEMAKER_ACTIONS = {
    "createendpoint",
    "createendpointconfig",
    "createhyperparametertuningjob",
    "createlabelingjob",
    "createmodel",
    "createprocessingjob",
    "createtrainingjob",
    "createtransformjob",
    "updateendpoint",
}
# action -> (describe call, name parameter, status field, terminal success, terminal failures)
SAGEMAKER_JOBS = {
    "createtrainingjob": (
        "describe_training_job",
        "TrainingJobName",
        "TrainingJobStatus",
        "Completed",
        ("Failed", "Stopped"),
    ),
    "createprocessingjob": (
        "describe_processing_job",
        "ProcessingJobName",
        "ProcessingJobStatus",
        "Completed",
        ("Failed", "Stopped"),
    ),
    "createtransformjob": (
        "describe_transform_job",
        "TransformJobName",
        "TransformJobStatus",
        "Completed",
        ("Failed", "Stopped"),
    ),
    "createhyperparametertuningjob": (
        "describe_hyper_parameter_tuning_job",
        "HyperParameterTuningJobName",
        "HyperParameterTuningJobStatus",
        "Completed",
        ("Failed", "Stopped"),
    ),
}


def aws_sdk_error_name(service: str, code: str) -> str:
    """The error name Step Functions gives an aws-sdk task's failed call."""
    prefix = SFN_ERROR_SERVICE_NAMES.get(service.lower(), service[:1].upper() + service[1:])
    if code not in modelled_errors(service):
        return f"{prefix}.{prefix}Exception"
    return f"{prefix}.{code if code.endswith('Exception') else code + 'Exception'}"


@functools.cache
def modelled_errors(service: str) -> frozenset[str]:
    """The error codes `service`'s API models (botocore's error shapes)."""
    from botocore.session import get_session

    name = SFN_SERVICE_NAMES.get(service.lower(), service.lower())
    model = get_session().get_service_model(name)
    codes = set()
    for shape in model.error_shapes:
        codes.add(shape.name)
        codes.add(shape.metadata.get("error", {}).get("code", shape.name))
    return frozenset(codes)


def _aws_sdk_exception_name(norm_service_name: str, ex: Exception) -> str:
    from botocore.exceptions import ClientError

    code = ex.response["Error"]["Code"] if isinstance(ex, ClientError) else type(ex).__name__
    return aws_sdk_error_name(norm_service_name, code)


def _aws_sdk_service_error_name(service_name: str) -> str:
    return service_name


def _task_parameters(moto_eval_parameters):
    """A Task without Parameters sends its effective input (after InputPath) as the request, as
    Step Functions does; moto's interpreter sent an empty request."""
    import copy

    def eval_parameters(self, env) -> dict:
        if self.parargs is None:
            return copy.deepcopy(env.stack[-1])
        return moto_eval_parameters(self, env)

    return eval_parameters


@functools.cache
def sagemaker_task_class():
    """Step Functions' optimized SageMaker integration (`arn:aws:states:::sagemaker:<action>`,
    `.sync` for jobs) for moto's interpreter, which forwards these calls without `.sync`.

    Errors are named as the optimized integration names them (`SageMaker.AmazonSageMakerException`,
    the cause carrying the service's error code); a job that ends Failed or Stopped fails the task
    with `States.TaskFailed` and the job's description as the cause; a Completed job's description
    is the task's result."""
    from botocore.exceptions import ClientError
    from moto.stepfunctions.parser.api import HistoryEventType, TaskFailedEventDetails
    from moto.stepfunctions.parser.asl.component.common.error_name.custom_error_name import (
        CustomErrorName,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEvent,
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import (
        StatesErrorName,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import (
        StatesErrorNameType,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.resource import (
        ResourceCondition,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (  # noqa: E501
        StateTaskServiceCallback,
    )
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails
    from moto.stepfunctions.parser.asl.utils.boto_client import boto_client_for

    client_for = cached_boto_client_for(boto_client_for)

    def as_json(value) -> object:
        return json.loads(json.dumps(value, default=str))

    class SageMakerTask(StateTaskServiceCallback):
        def __init__(self):
            super().__init__(
                supported_integration_patterns={
                    ResourceCondition.WaitForTaskToken,
                    ResourceCondition.Sync,
                }
            )

        def _validate_service_integration_is_supported(self):
            action = self.resource.api_action.lower()
            if action not in SAGEMAKER_ACTIONS:
                raise ValueError(f"{self.resource.resource_arn}: not an optimized SageMaker action")
            if self.resource.condition == ResourceCondition.Sync and action not in SAGEMAKER_JOBS:
                raise ValueError(f"{self.resource.resource_arn}: SageMaker has no .sync for it")

        def _failure(self, env, error: str, cause: str, name=None) -> FailureEventException:
            return FailureEventException(
                FailureEvent(
                    env=env,
                    error_name=name or CustomErrorName(error_name=error),
                    event_type=HistoryEventType.TaskFailed,
                    event_details=EventDetails(
                        taskFailedEventDetails=TaskFailedEventDetails(
                            resource=self._get_sfn_resource(),
                            resourceType=self._get_sfn_resource_type(),
                            error=error,
                            cause=cause,
                        )
                    ),
                )
            )

        def _from_error(self, env, ex):
            if isinstance(ex, ClientError):
                meta = ex.response.get("ResponseMetadata", {})
                cause = (
                    f"{ex.response['Error'].get('Message', '')} (Service: AmazonSageMaker; "
                    f"Status Code: {meta.get('HTTPStatusCode', 400)}; "
                    f"Error Code: {ex.response['Error']['Code']}; "
                    f"Request ID: {meta.get('RequestId', '')}; Proxy: null)"
                )
                error = "SageMaker.AmazonSageMakerException"
                return self._failure(env, error, cause).failure_event
            return super()._from_error(env, ex)

        def _client(self, region, credentials):
            return client_for(service="sagemaker", region=region, state_credentials=credentials)

        # moto calls these two with keyword arguments: the parameter names are its own
        def _eval_service_task(
            self, env, resource_runtime_part, normalised_parameters, state_credentials
        ):
            client = self._client(resource_runtime_part.region, state_credentials)
            response = getattr(client, self._get_boto_service_action())(**normalised_parameters)
            response.pop("ResponseMetadata", None)
            env.stack.append(as_json(response))

        def _build_sync_resolver(
            self, env, resource_runtime_part, normalised_parameters, state_credentials
        ):
            describe, key, field, done, failed = SAGEMAKER_JOBS[self.resource.api_action.lower()]
            client = self._client(resource_runtime_part.region, state_credentials)
            env.stack.pop()  # the Create call's answer: .sync answers with the job's description
            name = normalised_parameters[key]

            def resolve():
                job = getattr(client, describe)(**{key: name})
                job.pop("ResponseMetadata", None)
                job = as_json(job)
                if job.get(field) == done:
                    return job
                if job.get(field) in failed:
                    raise self._failure(
                        env,
                        StatesErrorNameType.StatesTaskFailed.to_name(),
                        json.dumps(job),
                        StatesErrorName(typ=StatesErrorNameType.StatesTaskFailed),
                    )
                return None

            return resolve

    return SageMakerTask


def eval_jsonata(expression: str) -> object:
    """A JSONata expression's value. moto's interpreter composes the expression (its `$states`
    bindings included) and hands it to LocalStack's Java evaluator, absent here: jsonata-python
    evaluates it instead; its errors become the interpreter's own JSONata error."""
    import jsonata
    from moto.stepfunctions.parser.asl.jsonata.jsonata import JSONataException

    try:
        return jsonata.Jsonata(expression).evaluate(None)
    except Exception as e:
        raise JSONataException("UNKNOWN", str(e)) from e


def service_names() -> dict[str, str]:
    """moto's Step Functions-to-boto3 service names with the ones it misses."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
        state_task_service,
    )

    names = dict(state_task_service.StateTaskService._SERVICE_NAME_SFN_TO_BOTO_OVERRIDES)
    names.update(SFN_SERVICE_NAMES)
    return names


def bucket_permission(bucket, action: str, resource: str):
    """A bucket policy's verdict on an object request, IAM's way.

    moto answers DENIED for any statement whose Condition it cannot confirm, so the template's
    `Deny ... if aws:SecureTransport is false` refused every request. In IAM a statement whose
    condition does not hold does not apply; moto has no request context to confirm one, so such a
    statement is left out here (the local endpoint is plain HTTP on loopback).
    """
    import json

    from moto.iam.access_control import IAMPolicyStatement, PermissionResult

    if bucket.policy is None:
        return PermissionResult.NEUTRAL
    doc = json.loads(bucket.policy)
    statements = doc.get("Statement", [])
    result = PermissionResult.NEUTRAL
    for st in statements if isinstance(statements, list) else [statements]:
        if st.get("Condition"):
            continue
        verdict = IAMPolicyStatement(st).is_action_permitted(action, resource)
        if verdict == PermissionResult.DENIED:
            return verdict
        if verdict == PermissionResult.PERMITTED:
            result = verdict
    return result


def json_copy(value):
    """A deep copy of a JSON value, ~4x faster than `copy.deepcopy` (which moto's interpreter
    runs on every path it reads: a tenth of a state machine's time); anything else is
    deep-copied as before."""
    kind = type(value)
    if kind is dict:
        return {key: json_copy(item) for key, item in value.items()}
    if kind is list:
        return [json_copy(item) for item in value]
    if kind in (str, int, float, bool) or value is None:
        return value
    return copy.deepcopy(value)


def cached_json_path_parse(parse):
    """jsonpath_ng's `parse`, once per path: it builds a new parser (its yacc tables read
    again) on every call, and moto's interpreter parses each path each time a state runs.
    The parsed paths are not changed by use (`find`, `update_or_create` change the data)."""
    return _cached(getattr(parse, "__wrapped__", parse))


@functools.cache  # one cache per parse function, however often the patches are made
def _cached(parse):
    return functools.lru_cache(maxsize=4096)(parse)


_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


def cached_boto_client_for(boto_client_for):
    """moto's `boto_client_for`, one client per service and region: it built a new boto3 client
    for every service call a state made (a fifth of a state machine's time). boto3 clients are
    safe to share between threads; moto's interpreter ignores the state's credentials."""
    from moto.core.models import botocore_stubber
    from moto.settings import moto_server_port

    original = getattr(boto_client_for, "__wrapped__", boto_client_for)

    @functools.wraps(original)
    def client_for(region: str, service: str, state_credentials=None):
        key = (original, region, service, botocore_stubber.enabled, moto_server_port())
        with _clients_lock:
            if key not in _clients:
                _clients[key] = original(region, service, state_credentials)
            return _clients[key]

    return client_for


def interpreter_patches() -> list[tuple[object, str, object]]:
    """(owner, attribute, value) for each Step Functions interpreter fix; `apply` sets them for
    the local stack's lifetime, tests set them with monkeypatch."""
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import state_task_factory
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
        state_task_service,
        state_task_service_aws_sdk,
        state_task_service_factory,
    )
    from moto.stepfunctions.parser.asl.jsonata import jsonata

    sagemaker_task = sagemaker_task_class()
    moto_factory = state_task_service_factory.state_task_service_for

    def state_task_service_for(service_name: str):
        return sagemaker_task() if service_name == "sagemaker" else moto_factory(service_name)

    aws_sdk = state_task_service_aws_sdk.StateTaskServiceAwsSdk
    service = state_task_service.StateTaskService
    return [
        *_speed_patches(),
        (service, "_eval_parameters", _task_parameters(service._eval_parameters)),
        (
            state_task_service.StateTaskService,
            "_SERVICE_NAME_SFN_TO_BOTO_OVERRIDES",
            service_names(),
        ),
        (state_task_factory, "state_task_service_for", state_task_service_for),
        (aws_sdk, "_normalise_service_error_name", staticmethod(_aws_sdk_service_error_name)),
        (aws_sdk, "_normalise_exception_name", staticmethod(_aws_sdk_exception_name)),
        (jsonata, "_eval_jsonata", eval_jsonata),
    ]


def _speed_patches() -> list[tuple[object, str, object]]:
    """Caches and copies that change how fast moto's interpreter runs, not what it does."""
    import jsonpath_ng
    from moto.stepfunctions.parser.asl.component.common.path import result_path
    from moto.stepfunctions.parser.asl.component.common.string import string_expression
    from moto.stepfunctions.parser.asl.eval import states
    from moto.stepfunctions.parser.asl.utils import boto_client, json_path

    copies = SimpleNamespace(deepcopy=json_copy)
    patches: list[tuple[object, str, object]] = [
        (json_path, "parse", cached_json_path_parse(json_path.parse)),
        (result_path, "parse", cached_json_path_parse(jsonpath_ng.parse)),
        (states, "copy", copies),
        (string_expression, "copy", copies),
    ]
    # every module of the interpreter that imported it (the service integrations)
    client_for = cached_boto_client_for(boto_client.boto_client_for)
    for name, module in list(sys.modules.items()):
        if name.startswith("moto.stepfunctions.parser") and hasattr(module, "boto_client_for"):
            patches.append((module, "boto_client_for", client_for))
    return patches


def _idempotent_model_package(moto_create):
    """CreateModelPackage with a ClientToken it has seen returns that package, as SageMaker does
    (the token "guarantees that the call to this API is idempotent"); moto made a second one."""

    def create_model_package(backend, *args, **kwargs):
        token = kwargs.get("client_token")
        if token:
            for package in backend.model_packages.values():
                if getattr(package, "client_token", None) == token:
                    return package.arn
        return moto_create(backend, *args, **kwargs)

    return create_model_package


def _deregister_not_found(moto_deregister):
    """DeregisterScalableTarget of a target that is not registered: Application Auto Scaling
    answers ObjectNotFoundException (its API reference); moto answered ValidationException."""
    from moto.core.exceptions import JsonRESTError

    def deregister_scalable_target(backend, namespace, r_id, dimension):
        if not backend._scalable_target_exists(r_id, dimension):
            raise JsonRESTError(
                "ObjectNotFoundException",
                f"No scalable target registered for service namespace: {namespace}, resource "
                f"ID: {r_id}, scalable dimension: {dimension}",
            )
        return moto_deregister(backend, namespace, r_id, dimension)

    return deregister_scalable_target


# moto's SQS scans a queue's messages with a datetime per message, and ReceiveMessage checks each
# message's retention through GetQueueAttributes, which builds every attribute three times
# (counts that scan all messages again): a receive costs O(messages^2). With the thousands of
# uploads a burst leaves in the incoming queue, the local stack spent most of its time there
# (py-spy at 2,000 queued messages: 49 % of its CPU; finding the backend of a request, 16 %).
# Same answers, in O(messages).
def _now_ms() -> float:
    return time.time() * 1000.0


def _message_visible(self) -> bool:
    return _now_ms() > self.visible_at


def _message_delayed(self) -> bool:
    return _now_ms() < self.delayed_until


# bumped whenever a message's visibility changes (received, ChangeMessageVisibility): the counts
# below are reused only while it is unchanged
_visibility_changes = [0]


def _changing_visibility(method):
    @functools.wraps(method)
    def changed(self, *args, **kwargs):
        _visibility_changes[0] += 1
        return method(self, *args, **kwargs)

    return changed


def _counts(queue) -> tuple[int, int, int]:
    """(visible, delayed, not visible) messages, in one pass: moto made four passes each time
    it built a queue's attributes, which SendMessage does for every message. Within a second
    and while no message's visibility changed, messages appended since are added to the last
    count (a delay that ran out meanwhile shows at the next second, as approximate as SQS says
    these counts are); any other change of the list, a full pass."""
    now, messages = _now_ms(), queue._messages
    key = (int(now // 1000), id(messages), _visibility_changes[0])
    cached = queue.__dict__.get("_sluice_counts")
    start, counts = 0, (0, 0, 0)
    if cached is not None and cached[0] == key and cached[1] <= len(messages):
        start, counts = cached[1], cached[2]
    visible, delayed, hidden = counts
    for m in messages[start:]:
        shown, later = now > m.visible_at, now < m.delayed_until
        hidden += not shown
        delayed += later
        visible += shown and not later
    counts = (visible, delayed, hidden)
    queue.__dict__["_sluice_counts"] = (key, len(messages), counts)
    return counts


def _deleting_under_the_queue_lock(delete_message):
    """moto deletes a message by rebuilding the queue's list from the current one and assigning
    it: two deletes at once, or a send in between (it appends under the queue's lock), and the
    last assignment drops what the other added. The local stack answers requests concurrently,
    and its SQS poller deletes every message of a batch it ran while uploads keep arriving:
    10,000 uploads lost 218 S3 notifications, silently. Deleting under the lock that sends
    take (moto's own) makes the rebuild atomic."""

    @functools.wraps(delete_message)
    def delete(self, receipt_handle: str) -> None:
        with self._messages_lock:
            return delete_message(self, receipt_handle)

    return delete


def _within_retention(self, queue_name: str, message) -> bool:
    retention_s = float(self.get_queue(queue_name).message_retention_period)
    return retention_s + message.sent_timestamp / 1000 > time.time()


def _original(owner, name: str):
    """What moto defined, even after apply() ran before (its patches wrap the original once)."""
    value = getattr(owner, name)
    return getattr(value, "__wrapped__", value)


def backend_patches() -> list[tuple[object, str, object]]:
    """(owner, attribute, value) for each fix to moto's services."""
    from moto import backends
    from moto.applicationautoscaling.models import ApplicationAutoscalingBackend
    from moto.iam.responses import IamResponse
    from moto.s3.models import FakeBucket
    from moto.sagemaker.models import SageMakerModelBackend
    from moto.sqs.models import Message, Queue, SQSBackend

    from .iam_simulation import simulate_principal_policy

    modules = tuple(backends.list_of_moto_modules())  # moto lists its folder on every request
    return [
        (
            Queue,
            "delete_message",
            _deleting_under_the_queue_lock(_original(Queue, "delete_message")),
        ),
        (Message, "visible", property(_message_visible)),
        (Message, "mark_received", _changing_visibility(_original(Message, "mark_received"))),
        (
            Message,
            "change_visibility",
            _changing_visibility(_original(Message, "change_visibility")),
        ),
        (Message, "delayed", property(_message_delayed)),
        (SQSBackend, "is_message_valid_based_on_retention_period", _within_retention),
        (Queue, "approximate_number_of_messages", property(lambda q: _counts(q)[0])),
        (Queue, "approximate_number_of_messages_delayed", property(lambda q: _counts(q)[1])),
        (Queue, "approximate_number_of_messages_not_visible", property(lambda q: _counts(q)[2])),
        (backends, "list_of_moto_modules", lambda: modules),
        (FakeBucket, "get_permission", bucket_permission),
        # moto lacks IAM's policy simulator; the SageMaker SDK asks it about execution roles
        (IamResponse, "simulate_principal_policy", simulate_principal_policy),
        (
            SageMakerModelBackend,
            "create_model_package",
            _idempotent_model_package(SageMakerModelBackend.create_model_package),
        ),
        (
            ApplicationAutoscalingBackend,
            "deregister_scalable_target",
            _deregister_not_found(ApplicationAutoscalingBackend.deregister_scalable_target),
        ),
    ]


def apply() -> None:
    """Install the fixes in this process (the local stack's)."""
    for owner, name, value in interpreter_patches() + backend_patches():
        setattr(owner, name, value)
