"""The local SageMaker's hyperparameter tuning jobs: requests refused as SageMaker refuses them,
trials launched through its own CreateTrainingJob (validated, tagged, named as SageMaker names
them) at most MaxParallelTrainingJobs at a time, the best trial by the objective, Describe and
List in SageMaker's shapes, StopHyperParameterTuningJob, a restart that carries on.

Training itself is not what is tested here: a stand-in training service ends each job with a
`validation_loss` computed from its hyperparameters (the real container trains in the e2e test,
tests/e2e/test_local_stack.py, where a retrain tunes)."""

from __future__ import annotations

import copy
import json
import math
import threading
import time

import pytest
from botocore.parsers import create_parser

from sluice_local.sagemaker.api import LocalSageMaker
from sluice_local.sagemaker.runtime import Context
from sluice_local.sagemaker.shapes import ApiError, operation
from sluice_local.sagemaker.tuning import TuningRunner

ROLE = "arn:aws:iam::123456789012:role/sm"
METRICS = [
    {"Name": "validation_loss", "Regex": r"validation_loss=([0-9.]+)"},
    {"Name": "train_loss", "Regex": r"train_loss=([0-9.]+)"},
]
REQUEST = {
    "HyperParameterTuningJobName": "sluice-test-12345678",
    "HyperParameterTuningJobConfig": {
        "Strategy": "Random",
        "HyperParameterTuningJobObjective": {"Type": "Minimize", "MetricName": "validation_loss"},
        "ResourceLimits": {"MaxNumberOfTrainingJobs": 5, "MaxParallelTrainingJobs": 2},
        "ParameterRanges": {
            "ContinuousParameterRanges": [
                {
                    "Name": "learning_rate",
                    "MinValue": "0.0001",
                    "MaxValue": "0.1",
                    "ScalingType": "Logarithmic",
                }
            ],
            "IntegerParameterRanges": [{"Name": "warmup_steps", "MinValue": "0", "MaxValue": "20"}],
        },
        "RandomSeed": 7,
    },
    "TrainingJobDefinition": {
        "StaticHyperParameters": {"max_steps": "30"},
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/sluice:1",
            "TrainingInputMode": "File",
            "MetricDefinitions": METRICS,
        },
        "RoleArn": ROLE,
        "InputDataConfig": [
            {
                "ChannelName": "train",
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/training/"}
                },
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://b/models/"},
        "ResourceConfig": {
            "InstanceType": "ml.g5.2xlarge",
            "InstanceCount": 1,
            "VolumeSizeInGB": 50,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    },
    "Tags": [{"Key": "sluice:execution", "Value": "ex-1"}],
}


def loss(hp: dict) -> float:
    """The stand-in's objective: best at learning_rate 3e-3 (log scale)."""
    return 2.0 + (math.log10(float(hp["learning_rate"])) - math.log10(3e-3)) ** 2


class StandInTraining:
    """Plays SageMaker's training service: a job runs for `seconds`, then Completed with the
    metrics its container would log (or Failed when `fail` says so)."""

    kind, status_key = "TrainingJob", "TrainingJobStatus"

    def __init__(self, api: LocalSageMaker, seconds: float = 0.2, fail=lambda hp: False):
        self.api, self.seconds, self.fail = api, seconds, fail
        self.running: set[str] = set()
        self.most_at_once = 0
        self.stopped: set[str] = set()
        self.lock = threading.Lock()
        self.closing = False

    def shutdown(self) -> None:  # the stack stops: jobs end with their records as they are
        self.closing = True

    def start(self, name: str) -> None:
        with self.lock:
            self.running.add(name)
            self.most_at_once = max(self.most_at_once, len(self.running))
        threading.Thread(target=self._run, args=(name,), daemon=True).start()

    def _run(self, name: str) -> None:
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline and name not in self.stopped:
            time.sleep(0.02)
        if self.closing:
            return
        hp = self.api.get("TrainingJob", name)["HyperParameters"]
        with self.lock:
            self.running.discard(name)
        if name in self.stopped:
            self.api.update("TrainingJob", name, TrainingJobStatus="Stopped")
        elif self.fail(hp):
            self.api.update(
                "TrainingJob",
                name,
                TrainingJobStatus="Failed",
                FailureReason="AlgorithmError: diverged",
            )
        else:
            metrics = [
                {"MetricName": "validation_loss", "Value": loss(hp), "Timestamp": time.time()}
            ]
            self.api.update(
                "TrainingJob", name, TrainingJobStatus="Completed", FinalMetricDataList=metrics
            )

    def stop(self, name: str) -> None:
        self.stopped.add(name)
        self.api.update("TrainingJob", name, TrainingJobStatus="Stopping")


@pytest.fixture
def local(tmp_path):
    return start(tmp_path)


def start(state, **training):
    events: list[tuple[str, dict]] = []
    said: list[str] = []
    api = LocalSageMaker(state, lambda kind, detail: events.append((kind, detail)))
    ctx = Context(state, "http://127.0.0.1:1", {}, lambda cat, msg: said.append(msg))
    api.runners["TrainingJob"] = training_ = StandInTraining(api, **training)
    api.runners["HyperParameterTuningJob"] = tuning = TuningRunner(api, ctx, poll_s=0.05)
    return {"api": api, "training": training_, "tuning": tuning, "events": events, "said": said}


def parsed(op: str, answer: dict) -> dict:
    response = {"body": json.dumps(answer).encode(), "headers": {}, "status_code": 200}
    return create_parser("json").parse(response, operation(op).output_shape)


def wait_done(api: LocalSageMaker, name: str, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        d = api.call("DescribeHyperParameterTuningJob", {"HyperParameterTuningJobName": name})
        if d["HyperParameterTuningJobStatus"] not in ("InProgress", "Stopping"):
            return parsed("DescribeHyperParameterTuningJob", d)
        time.sleep(0.05)
    raise AssertionError(f"{name} still running after {timeout_s} s")


def test_a_random_search_runs_its_trials_in_parallel_and_names_the_best(local):
    api = local["api"]
    arn = api.call("CreateHyperParameterTuningJob", REQUEST)["HyperParameterTuningJobArn"]
    assert arn.endswith(":hyper-parameter-tuning-job/sluice-test-12345678")
    d = wait_done(api, REQUEST["HyperParameterTuningJobName"])
    assert d["HyperParameterTuningJobStatus"] == "Completed"
    assert d["TrainingJobStatusCounters"] == {
        "Completed": 5,
        "InProgress": 0,
        "RetryableError": 0,
        "NonRetryableError": 0,
        "Stopped": 0,
    }
    assert d["ObjectiveStatusCounters"] == {"Succeeded": 5, "Pending": 0, "Failed": 0}
    assert local["training"].most_at_once == 2  # MaxParallelTrainingJobs
    listed = parsed(
        "ListTrainingJobsForHyperParameterTuningJob",
        api.call(
            "ListTrainingJobsForHyperParameterTuningJob",
            {
                "HyperParameterTuningJobName": REQUEST["HyperParameterTuningJobName"],
                "SortBy": "FinalObjectiveMetricValue",
                "MaxResults": 100,
            },
        ),
    )["TrainingJobSummaries"]
    values = [s["FinalHyperParameterTuningJobObjectiveMetric"]["Value"] for s in listed]
    assert len(values) == 5 and values == sorted(values)
    best = d["BestTrainingJob"]
    assert best["TrainingJobName"] == listed[0]["TrainingJobName"]
    assert best["FinalHyperParameterTuningJobObjectiveMetric"]["Value"] == min(values)
    assert best["TunedHyperParameters"] == listed[0]["TunedHyperParameters"]
    for s in listed:  # SageMaker's trial names; values within the ranges
        assert s["TrainingJobName"].startswith("sluice-test-12345678-0")
        assert len(s["TrainingJobName"]) == len("sluice-test-12345678-001-0123abcd")
        assert 1e-4 <= float(s["TunedHyperParameters"]["learning_rate"]) <= 0.1
        assert 0 <= int(s["TunedHyperParameters"]["warmup_steps"]) <= 20
    job = api.call("DescribeTrainingJob", {"TrainingJobName": best["TrainingJobName"]})
    assert job["TuningJobArn"] == arn
    assert job["HyperParameters"] == {
        "max_steps": "30",
        **best["TunedHyperParameters"],
        "_tuning_objective_metric": "validation_loss",
    }
    tags = api.call("ListTags", {"ResourceArn": job["TrainingJobArn"]})["Tags"]
    assert tags == REQUEST["Tags"]
    kinds = [k for k, _ in local["events"]]
    assert kinds[-1] == "SageMaker HyperParameter Tuning Job State Change"
    assert local["events"][-1][1]["HyperParameterTuningJobStatus"] == "Completed"


def test_the_same_seed_draws_the_same_values(tmp_path):
    drawn = []
    for i in (1, 2):
        local = start(tmp_path / str(i))
        local["api"].call("CreateHyperParameterTuningJob", REQUEST)
        wait_done(local["api"], REQUEST["HyperParameterTuningJobName"])
        listed = local["api"].call(
            "ListTrainingJobsForHyperParameterTuningJob",
            {"HyperParameterTuningJobName": REQUEST["HyperParameterTuningJobName"]},
        )["TrainingJobSummaries"]
        drawn.append(sorted(json.dumps(s["TunedHyperParameters"]) for s in listed))
    assert drawn[0] == drawn[1]


def test_bayesian_runs_as_random_search_and_says_so(local):
    request = copy.deepcopy(REQUEST)
    request["HyperParameterTuningJobConfig"]["Strategy"] = "Bayesian"
    request["HyperParameterTuningJobConfig"]["TrainingJobEarlyStoppingType"] = "Auto"
    local["api"].call("CreateHyperParameterTuningJob", request)
    assert (
        wait_done(local["api"], request["HyperParameterTuningJobName"])[
            "HyperParameterTuningJobStatus"
        ]
        == "Completed"
    )
    assert any("Bayesian strategy runs as random search" in m for m in local["said"])
    assert any(
        "not applied on local SageMaker: TrainingJobEarlyStoppingType=Auto" in m
        for m in local["said"]
    )


def test_grid_search_tries_every_combination(local):
    request = copy.deepcopy(REQUEST)
    config = request["HyperParameterTuningJobConfig"]
    config["Strategy"] = "Grid"
    config["ResourceLimits"] = {"MaxParallelTrainingJobs": 2}
    config["ParameterRanges"] = {
        "CategoricalParameterRanges": [
            {"Name": "learning_rate", "Values": ["0.0003", "0.003", "0.03"]},
            {"Name": "warmup_steps", "Values": ["0", "10"]},
        ]
    }
    local["api"].call("CreateHyperParameterTuningJob", request)
    d = wait_done(local["api"], request["HyperParameterTuningJobName"])
    assert d["TrainingJobStatusCounters"]["Completed"] == 6
    assert d["BestTrainingJob"]["TunedHyperParameters"]["learning_rate"] == "0.003"
    listed = local["api"].call(
        "ListTrainingJobsForHyperParameterTuningJob",
        {"HyperParameterTuningJobName": request["HyperParameterTuningJobName"]},
    )["TrainingJobSummaries"]
    points = {tuple(sorted(s["TunedHyperParameters"].items())) for s in listed}
    assert len(points) == 6


@pytest.mark.parametrize(
    "change, says",
    [
        (
            lambda r: r["HyperParameterTuningJobConfig"].update(
                HyperParameterTuningJobObjective={"Type": "Minimize", "MetricName": "perplexity"}
            ),
            "MetricDefinitions",
        ),
        (
            lambda r: r["TrainingJobDefinition"]["StaticHyperParameters"].update(
                learning_rate="0.001"
            ),
            "both static and tuned",
        ),
        (
            lambda r: r["HyperParameterTuningJobConfig"]["ParameterRanges"][
                "ContinuousParameterRanges"
            ][0].update(MinValue="0"),
            "Logarithmic scaling needs MinValue > 0",
        ),
        (
            lambda r: r["HyperParameterTuningJobConfig"]["ParameterRanges"][
                "IntegerParameterRanges"
            ][0].update(MaxValue="ten"),
            "integers",
        ),
        (
            lambda r: r["HyperParameterTuningJobConfig"]["ResourceLimits"].update(
                MaxParallelTrainingJobs=9
            ),
            "MaxParallelTrainingJobs",
        ),
        (lambda r: r.update(HyperParameterTuningJobName="sluice-test-" + "x" * 30), "32"),
        (lambda r: r["HyperParameterTuningJobConfig"].update(Strategy="Grid"), "categorical"),
    ],
)
def test_requests_sagemaker_refuses_are_refused(local, change, says):
    request = copy.deepcopy(REQUEST)
    change(request)
    with pytest.raises(ApiError) as e:
        local["api"].call("CreateHyperParameterTuningJob", request)
    assert e.value.code == "ValidationException" and says in e.value.message
    assert not local["api"].resources["HyperParameterTuningJob"]


def test_a_name_in_use_is_refused(local):
    local["api"].call("CreateHyperParameterTuningJob", REQUEST)
    with pytest.raises(ApiError) as e:
        local["api"].call("CreateHyperParameterTuningJob", REQUEST)
    assert e.value.code == "ResourceInUse"
    wait_done(local["api"], REQUEST["HyperParameterTuningJobName"])


def test_no_trial_with_the_objective_fails_the_job_with_the_reasons(tmp_path):
    local = start(tmp_path, fail=lambda hp: True)
    local["api"].call("CreateHyperParameterTuningJob", REQUEST)
    d = wait_done(local["api"], REQUEST["HyperParameterTuningJobName"])
    assert d["HyperParameterTuningJobStatus"] == "Failed"
    assert d["TrainingJobStatusCounters"]["NonRetryableError"] == 5
    assert (
        "validation_loss" in d["FailureReason"] and "AlgorithmError: diverged" in d["FailureReason"]
    )
    assert "BestTrainingJob" not in d


def test_some_failed_trials_still_leave_a_best(tmp_path):
    local = start(tmp_path, fail=lambda hp: float(hp["learning_rate"]) > 0.002)
    local["api"].call("CreateHyperParameterTuningJob", REQUEST)
    d = wait_done(local["api"], REQUEST["HyperParameterTuningJobName"])
    failed = d["TrainingJobStatusCounters"]["NonRetryableError"]
    assert d["HyperParameterTuningJobStatus"] == "Completed" and 0 < failed < 5
    assert d["ObjectiveStatusCounters"]["Failed"] == failed
    assert float(d["BestTrainingJob"]["TunedHyperParameters"]["learning_rate"]) <= 0.002


def test_stop_stops_the_running_trials_and_launches_no_more(tmp_path):
    local = start(tmp_path, seconds=30)
    api = local["api"]
    api.call("CreateHyperParameterTuningJob", REQUEST)
    name = REQUEST["HyperParameterTuningJobName"]
    deadline = time.monotonic() + 10
    while len(local["training"].running) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    api.call("StopHyperParameterTuningJob", {"HyperParameterTuningJobName": name})
    d = wait_done(api, name)
    assert d["HyperParameterTuningJobStatus"] == "Stopped"
    assert d["TrainingJobStatusCounters"]["Stopped"] == 2
    assert sum(d["TrainingJobStatusCounters"].values()) == 2  # nothing launched after the stop


def test_a_restart_carries_on_with_the_trials_it_launched(tmp_path):
    first = start(tmp_path, seconds=30)
    first["api"].call("CreateHyperParameterTuningJob", REQUEST)
    name = REQUEST["HyperParameterTuningJobName"]
    deadline = time.monotonic() + 10
    while len(first["training"].running) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    first["tuning"].shutdown()  # the stack stops: records stay InProgress
    first["training"].shutdown()
    launched = sorted(first["api"].resources["TrainingJob"])
    # a new stack on the same state: the interrupted trials run again (jobs.resume), and the
    # tuning job carries on from them instead of launching its trials anew
    again = start(tmp_path)
    from sluice_local.sagemaker.jobs import resume

    resume([again["training"], again["tuning"]])  # type: ignore[list-item]
    d = wait_done(again["api"], name)
    assert d["HyperParameterTuningJobStatus"] == "Completed"
    assert sum(d["TrainingJobStatusCounters"].values()) == 5
    assert set(launched) <= set(again["api"].resources["TrainingJob"])
