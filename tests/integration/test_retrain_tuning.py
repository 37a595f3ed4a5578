"""The retraining state machine with TuningStrategy on: a SageMaker hyperparameter tuning job
instead of one training job, its best trial gated, registered and released as a single job
would be. The real definition in moto's interpreter (tests/retrain_harness.py); every request
checked against AWS's own rules. The local stack runs real trials in tests/e2e/."""

from __future__ import annotations

import json

import boto3
import pytest

from tests import retrain_harness as h

pytestmark = pytest.mark.usefixtures("strict_aws")

# the tuned names are also in the deployment's defaults: they must leave the static ones
DEFAULTS = {"max_steps": "300", "learning_rate": "0.003", "warmup_steps": "20"}


@pytest.fixture
def world(monkeypatch):
    yield from h.world(
        monkeypatch,
        TuningStrategy="Random",
        TuningMaxJobs=2,
        TuningParallelJobs=2,
        TrainingHyperparameters=json.dumps(DEFAULTS),
    )


def scheduled(execution_arn: str, resource: str) -> list[dict]:
    sfn = boto3.client("stepfunctions", region_name=h.REGION)
    events = sfn.get_execution_history(executionArn=execution_arn, maxResults=1000)["events"]
    return [
        json.loads(e["taskScheduledEventDetails"]["parameters"])
        for e in events
        if e.get("taskScheduledEventDetails", {}).get("resource", "").startswith(resource)
    ]


def test_the_best_trial_is_gated_registered_and_released(world):
    d = h.run(world["arn"], "tuned", {"reason": "manual"})
    assert d["status"] == "SUCCEEDED", h.explain(d)
    out = json.loads(d["output"])
    made = h.calls(d["executionArn"])
    assert "sagemaker:createHyperParameterTuningJob.sync" in made
    assert "sagemaker:createTrainingJob.sync" not in made
    [request] = scheduled(d["executionArn"], "createHyperParameterTuningJob")
    tuning = request["HyperParameterTuningJobName"]
    assert tuning.startswith(f"sluice-{h.STAGE}-") and len(tuning) <= 32
    config = request["HyperParameterTuningJobConfig"]
    assert config["Strategy"] == "Random"
    assert config["HyperParameterTuningJobObjective"] == {
        "Type": "Minimize",
        "MetricName": "validation_loss",
    }
    assert config["ResourceLimits"]["MaxNumberOfTrainingJobs"] == 2
    ranges = config["ParameterRanges"]
    assert [r["Name"] for r in ranges["ContinuousParameterRanges"]] == ["learning_rate"]
    assert [r["Name"] for r in ranges["IntegerParameterRanges"]] == ["warmup_steps"]
    assert "CategoricalParameterRanges" not in ranges  # TuningLoraRanks empty
    definition = request["TrainingJobDefinition"]
    static = definition["StaticHyperParameters"]
    assert "learning_rate" not in static and "warmup_steps" not in static
    assert static["max_steps"] == "300"
    names = {m["Name"] for m in definition["AlgorithmSpecification"]["MetricDefinitions"]}
    assert "validation_loss" in names
    assert definition["CheckpointConfig"]["S3Uri"].startswith(f"s3://{h.BUCKET}/checkpoints/")
    # the best trial (lowest validation_loss) is what was gated and released
    best = f"{tuning}-002-00000001"
    assert out["trainingJob"] == best and out["outcome"] == "promoted"
    assert out["decision"]["challenger"] == 30.0
    assert out["trained"]["tuningJob"] == tuning
    assert out["trained"]["trials"]["Completed"] == 2
    assert out["trained"]["tunedHyperparameters"] == {
        "learning_rate": "0.0001",
        "warmup_steps": "10",
    }
    model = out["model"]
    described = boto3.client("sagemaker", region_name=h.REGION).describe_model(ModelName=model)
    trial = boto3.client("sagemaker", region_name=h.REGION).describe_training_job(
        TrainingJobName=best
    )
    assert (
        described["PrimaryContainer"]["ModelDataUrl"] == trial["ModelArtifacts"]["S3ModelArtifacts"]
    )
    artifacts = f"s3://{h.BUCKET}/models/{model}/artifacts/{best}/"
    [package] = scheduled(d["executionArn"], "createModelPackage")
    statistics = package["ModelMetrics"]["ModelQuality"]["Statistics"]["S3Uri"]
    assert statistics == artifacts + "evaluation.json"
    assert package["CustomerMetadataProperties"]["trainingJob"] == best
    [compile_] = scheduled(d["executionArn"], "createCompilationJob")
    assert compile_["InputConfig"]["S3Uri"] == artifacts + "edge/model.tar.gz"


def test_a_tuning_job_whose_trials_all_fail_is_reported_and_changes_nothing(world):
    world["sim"].trials = [{"train_loss": 9.0}, {"train_loss": 8.0}]  # no objective
    d = h.run(world["arn"], "tuned-failed", {"reason": "manual"})
    assert d["status"] == "FAILED", h.explain(d)
    assert d["error"] == "TuningFailed"
    assert "ended Failed" in d["cause"] and "validation_loss" in d["cause"]
    assert "sagemaker:createModelPackage" not in h.calls(d["executionArn"])
    [note] = h.notifications(world)
    assert note["outcome"] == "failed" and note["error"] == "TuningFailed"
