"""A retrain that tunes, on local Sluice as a user runs it (`sluice-local up`, TuningStrategy on):
new training data starts the state machine, which runs a hyperparameter tuning job whose trials
are real `sluice train` runs; the best trial by validation_loss is gated, registered and served."""

from __future__ import annotations

import json

import pytest

from sluice_local.corpus import generate
from tests.helpers import hp, running_stack

pytestmark = pytest.mark.slow

# small enough for CI's two cores; learning_rate and warmup_steps are tuned, so the static
# hyperparameters (TrainingHyperparameters) may name them: the state machine leaves them out
TRAINING = hp(max_steps=40, n_positions=64, block_size=32, vocab_size=384)
OVERRIDES = [
    f"TrainingHyperparameters={json.dumps(TRAINING)}",
    "EdgeSequenceLength=32",
    "TuningStrategy=Bayesian",
    "TuningMaxJobs=2",
    "TuningParallelJobs=2",
    "TuningLearningRates=0.0003,0.01",
    "TuningWarmupSteps=0,10",
]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    yield from running_stack(tmp_path_factory, "tuning", OVERRIDES)


def test_a_tuned_retrain_promotes_its_best_trial(local):
    users = local.users
    for i in (1, 2):  # RetrainMinObjects=2 locally
        users.put(f"training/animals-{i}.txt", generate(1500, seed=i))
    model = users.wait_for("the first promotion", users.champion, 1200)
    ex = local.execution("new-data-")
    assert ex["status"] == "SUCCEEDED", ex
    out = json.loads(ex["output"])
    assert out["outcome"] == "promoted" and out["model"] == model
    trained = out["trained"]
    sm = local.client("sagemaker")
    tuning = sm.describe_hyper_parameter_tuning_job(
        HyperParameterTuningJobName=trained["tuningJob"]
    )
    assert tuning["HyperParameterTuningJobStatus"] == "Completed"
    assert tuning["HyperParameterTuningJobConfig"]["Strategy"] == "Bayesian"
    assert tuning["TrainingJobStatusCounters"]["Completed"] == 2  # two real trainings ran
    trials = sm.list_training_jobs_for_hyper_parameter_tuning_job(
        HyperParameterTuningJobName=trained["tuningJob"], SortBy="FinalObjectiveMetricValue"
    )["TrainingJobSummaries"]
    assert len(trials) == 2
    losses = [t["FinalHyperParameterTuningJobObjectiveMetric"]["Value"] for t in trials]
    best = tuning["BestTrainingJob"]["TrainingJobName"]
    assert best == trials[0]["TrainingJobName"] == out["trainingJob"] == trained["job"]
    assert losses[0] <= losses[1]
    # each trial trained with its own values, its artifacts under its own name
    values = [t["TunedHyperParameters"] for t in trials]
    assert values[0] != values[1]
    for t in trials:
        job = sm.describe_training_job(TrainingJobName=t["TrainingJobName"])
        assert job["TuningJobArn"] == tuning["HyperParameterTuningJobArn"]
        assert job["HyperParameters"]["learning_rate"] == t["TunedHyperParameters"]["learning_rate"]
        assert users.keys(f"models/{model}/artifacts/{t['TrainingJobName']}/evaluation.json")
    # what serves is the best trial's model, registered with the best trial's evaluation
    described = sm.describe_model(ModelName=model)
    best_job = sm.describe_training_job(TrainingJobName=best)
    assert (
        described["PrimaryContainer"]["ModelDataUrl"]
        == best_job["ModelArtifacts"]["S3ModelArtifacts"]
    )
    [package] = sm.list_model_packages(
        ModelPackageGroupName=local.status["outputs"]["ModelPackageGroupName"]
    )["ModelPackageSummaryList"]
    described_package = sm.describe_model_package(ModelPackageName=package["ModelPackageArn"])
    assert described_package["ModelApprovalStatus"] == "Approved"
    statistics = described_package["ModelMetrics"]["ModelQuality"]["Statistics"]["S3Uri"]
    assert statistics.endswith(f"/models/{model}/artifacts/{best}/evaluation.json")
    [answer] = users.invoke([{"text": "The lazy cat eats", "parameters": {"max_new_tokens": 3}}])
    assert answer["task"] == "generate"
    assert "runs as random search on local SageMaker" in local.events()
