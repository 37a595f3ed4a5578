"""What every example shares: the SageMaker session, the execution role and the data bucket of
a Sluice deployment, read from its CloudFormation stack's outputs."""

from __future__ import annotations

import os

import boto3

# The SDK checks an execution role with IAM's policy simulator before it uses it, against a
# smoke list that includes VPC networking and an unconditioned cloudwatch:PutMetricData. Sluice's
# role is least-privilege (VPC permissions only when deployed into a VPC; metrics only in
# SageMaker's namespaces), so that check refuses it on AWS, and on local Sluice, which answers
# the simulator as IAM does. SageMaker itself enforces the role's real permissions at run time;
# the SDK's own switch skips its client-side check.
os.environ.setdefault("SAGEMAKER_VALIDATE_ROLE", "false")

from sagemaker.core.helper.session_helper import Session  # after the switch

STACK = os.environ.get("SLUICE_STACK", "sluice-local")


def outputs() -> dict[str, str]:
    """The Sluice stack's outputs (role, bucket, endpoint, ...) by name."""
    stack = boto3.client("cloudformation").describe_stacks(StackName=STACK)["Stacks"][0]
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def session(out: dict[str, str] | None = None) -> Session:
    """A SageMaker session whose default bucket is the deployment's data bucket (encrypted, and
    readable by Sluice's role) rather than the SDK's `sagemaker-<region>-<account>`."""
    out = out or outputs()
    return Session(
        boto_session=boto3.Session(),
        default_bucket=out["DataBucketName"],
        default_bucket_prefix="sdk",
    )


def metric_definitions() -> list:
    """The metrics Sluice's training prints (`name=value` lines), as the SDK's MetricDefinition."""
    from sagemaker.core.shapes import MetricDefinition

    names = ["train_loss", "validation_loss", "validation_perplexity", "tokens_per_second"]
    number = r"([-+]?(?:[0-9]*\.)?[0-9]+(?:[eE][-+]?[0-9]+)?)"
    return [MetricDefinition(name=n, regex=rf"\b{n}={number}") for n in names]


METRICS = metric_definitions()


def create_model(name: str, training_job: str, out: dict[str, str]):
    """A SageMaker Model of Sluice's image over a training job's model artifact."""
    from sagemaker.core.resources import Model, TrainingJob
    from sagemaker.core.shapes import ContainerDefinition

    boto = session(out).boto_session
    job = TrainingJob.get(training_job, session=boto)
    return Model.create(
        model_name=name,
        primary_container=ContainerDefinition(
            image=out["ImageUri"], model_data_url=job.model_artifacts.s3_model_artifacts
        ),
        execution_role_arn=out["SageMakerExecutionRoleArn"],
        session=boto,
    )
