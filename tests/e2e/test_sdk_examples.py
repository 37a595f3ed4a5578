"""examples/sdk/, run as a user runs them: the SageMaker Python SDK v3 in its own environment
(`make sdk`), against `sluice-local up`; only AWS_ENDPOINT_URL and the credentials say "local".
Train with ModelTrainer, tune with HyperparameterTuner, deploy and invoke an endpoint (a plain
string and JSON Lines), batch-transform an S3 prefix."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sluice_local.corpus import generate
from tests.helpers import running_stack

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SDK_PYTHON = REPO / ".venv-sdk" / "bin" / "python"
EXAMPLES = REPO / "examples" / "sdk"


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    if not SDK_PYTHON.exists():
        pytest.fail(f"{SDK_PYTHON} is missing: `make sdk` installs the SDK's environment")
    stacks = running_stack(tmp_path_factory, "sdk", [])
    stack = next(stacks)
    bucket = stack.status["outputs"]["DataBucketName"]
    s3 = stack.client("s3")
    s3.put_object(
        Bucket=bucket, Key="sdk-data/train/animals.txt", Body="\n".join(generate(800, seed=3))
    )
    prompts = [
        json.dumps({"id": "a", "text": "The lazy cat eats", "parameters": {"max_new_tokens": 4}}),
        json.dumps({"id": "b", "text": "Anna gave the dog", "task": "score"}),
        "{oops",
    ]
    s3.put_object(Bucket=bucket, Key="sdk-data/prompts/team-a.jsonl", Body="\n".join(prompts))
    stack.bucket = bucket
    yield stack
    next(stacks, None)  # stops it


def example(local, name: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """One example script with the SDK's Python, as a user runs it against local Sluice."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SAGEMAKER_"))}
    return subprocess.run(
        [str(SDK_PYTHON), str(EXAMPLES / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=900,
        env={
            **clean,
            "AWS_ENDPOINT_URL": local.endpoint,
            "AWS_ACCESS_KEY_ID": "local",
            "AWS_SECRET_ACCESS_KEY": "local",
            "AWS_DEFAULT_REGION": "us-east-1",
            **env,
        },
    )


def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def trained(local) -> str:
    out = ok(example(local, "train", f"s3://{local.bucket}/sdk-data/train/"))
    job = out.split("training job ", 1)[1].split(":", 1)[0]
    assert f"{job}: Completed" in out and "validation_loss = " in out
    return job


def test_train_with_model_trainer(local, trained):
    job = local.client("sagemaker").describe_training_job(TrainingJobName=trained)
    assert job["TrainingJobStatus"] == "Completed"
    assert job["AlgorithmSpecification"]["TrainingImage"] == "sluice:local"
    assert job["HyperParameters"]["max_steps"] == "60"
    assert job["ModelArtifacts"]["S3ModelArtifacts"].endswith("/output/model.tar.gz")
    assert {m["MetricName"] for m in job["FinalMetricDataList"]} >= {"validation_loss"}


def test_the_sdks_role_check_gets_iams_verdict(local):
    """With the SDK's role check on, local IAM's policy simulator answers as AWS's would: the
    least-privilege role lacks the SDK's VPC smoke actions and an unconditioned PutMetricData."""
    proc = example(
        local, "train", f"s3://{local.bucket}/sdk-data/train/", SAGEMAKER_VALIDATE_ROLE="true"
    )
    assert proc.returncode != 0
    assert "RoleValidationError" in proc.stderr
    assert "ec2:CreateNetworkInterface" in proc.stderr and "cloudwatch:PutMetricData" in proc.stderr
    assert (
        "ecr:GetAuthorizationToken"
        not in proc.stderr.split("Missing permissions:")[1].split("\n")[0]
    )


def test_tune_with_hyperparameter_tuner(local):
    out = ok(example(local, "tune", f"s3://{local.bucket}/sdk-data/train/"))
    tuning = out.split("tuning job ", 1)[1].split(":", 1)[0]
    best = out.split("best: ", 1)[1].strip()
    d = local.client("sagemaker").describe_hyper_parameter_tuning_job(
        HyperParameterTuningJobName=tuning
    )
    assert d["HyperParameterTuningJobStatus"] == "Completed"
    assert d["TrainingJobStatusCounters"]["Completed"] == 2
    assert d["BestTrainingJob"]["TrainingJobName"] == best
    ranges = d["HyperParameterTuningJobConfig"]["ParameterRanges"]
    assert ranges["ContinuousParameterRanges"][0]["Name"] == "learning_rate"


def test_deploy_and_invoke_an_endpoint(local, trained):
    out = ok(example(local, "deploy", trained, "sluice-sdk-endpoint"))
    assert out.startswith("predict: The quick brown fox jumps over the|")
    lines = [json.loads(x) for x in out.splitlines()[1:]]
    assert [x["id"] for x in lines] == ["g", "s", "n"]
    assert lines[0]["task"] == "generate" and lines[1]["task"] == "score"
    assert lines[2]["next_tokens"]
    endpoints = local.client("sagemaker").list_endpoints()["Endpoints"]
    assert "sluice-sdk-endpoint" not in [e["EndpointName"] for e in endpoints]  # cleaned up


def test_batch_transform_an_s3_prefix(local, trained):
    out = ok(example(local, "transform", trained, f"s3://{local.bucket}/sdk-data/prompts/"))
    assert ": Completed" in out.splitlines()[0]
    rows = out.splitlines()[1:]
    assert len(rows) == 3  # one output line per input line, in order
    assert '"id":"a"' in rows[0].split(" -> ")[1] and "invalid_json" in rows[2]
