"""AWS clients and error classification shared by the handlers (created once per cold start)."""

from __future__ import annotations

from functools import cache

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

# What the model parameter holds until retraining promotes a first model (template.yaml: "none").
NO_MODEL = ("", "none", "None")
CONFIG = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=30)


def current_model(parameter: str, max_age: int = 60) -> str | None:
    """The model batch inference and monitoring use (the SSM parameter retraining points), or
    None while it holds its placeholder. Read through Powertools Parameters: cached `max_age`
    seconds per warm container, so a burst of invocations costs one GetParameter."""
    from aws_lambda_powertools.utilities import parameters

    name = parameters.get_parameter(parameter, max_age=max_age)
    return None if name in NO_MODEL else name


@cache
def client(service: str):
    return boto3.client(service, config=CONFIG)


def error_code(e: ClientError) -> str:
    return e.response.get("Error", {}).get("Code", "")


def sagemaker_job(describe: str, **name: str) -> dict | None:
    """A SageMaker job's description (`describe`, e.g. "describe_transform_job"), or None if no
    job has that name."""
    try:
        return getattr(client("sagemaker"), describe)(**name)
    except ClientError as e:
        if error_code(e) in ("ValidationException", "ResourceNotFound"):
            return None  # SageMaker's answer for an unknown name
        raise


def sagemaker_job_status(describe: str, field: str, **name: str) -> str | None:
    """A SageMaker job's status (`field` of its description, e.g. `describe_transform_job`'s
    "TransformJobStatus"), or None if no job has that name."""
    job = sagemaker_job(describe, **name)
    return None if job is None else job[field]


def already_exists(e: ClientError) -> bool:
    """SageMaker's answer to a job name in use (a duplicate batch)."""
    msg = e.response.get("Error", {}).get("Message", "")
    return error_code(e) == "ResourceInUse" or "already exists" in msg or "must be unique" in msg
