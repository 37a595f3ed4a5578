"""Hyperparameter tuning jobs, run as SageMaker runs them.

A tuning job launches real training jobs (through the local SageMaker's own CreateTrainingJob, so
each is validated, run and evented like any other) from its TrainingJobDefinition: static
hyperparameters, values drawn from the ranges, and `_tuning_objective_metric` (SageMaker adds it,
and containers use it to tell a trial from a plain job). Names are `<tuning job>-<NNN>-<8 hex>`,
at most MaxParallelTrainingJobs run at once, MaxNumberOfTrainingJobs in all. Each trial's
objective is its final value of the objective metric (FinalMetricDataList, from the job's
MetricDefinitions); the best is BestTrainingJob. Describe and List answer with SageMaker's
counters and summaries.

What differs from SageMaker, said in the stack's log when it applies: Bayesian and Hyperband
search run as random search (their models of the objective are SageMaker's own), nothing is
stopped early, warm starts, completion criteria and Autotune are not applied, and `Auto`
scaling is logarithmic when the range spans a factor of 10 or more.
"""

from __future__ import annotations

import math
import random
import secrets
import time

from .api import LocalSageMaker
from .jobs import JobRunner
from .runtime import Context
from .shapes import ApiError

KIND = "HyperParameterTuningJob"
RUN_AS_RANDOM = ("Bayesian", "Hyperband")
TRIALS = "_Trials"  # the record's own list of launched trials: never rendered (not in a shape)
POLL_S = 1.0


def _invalid(message: str) -> ApiError:
    return ApiError("ValidationException", message)


def _ranges(config: dict) -> dict[str, list[dict]]:
    found = config.get("ParameterRanges") or {}
    return {
        kind: list(found.get(f"{kind}ParameterRanges") or [])
        for kind in ("Continuous", "Integer", "Categorical")
    }


def _bounds(kind: str, r: dict) -> tuple[float, float]:
    cast = float if kind == "Continuous" else int
    try:
        low, high = cast(r["MinValue"]), cast(r["MaxValue"])
    except ValueError:
        raise _invalid(
            f"{kind} parameter range {r['Name']}: MinValue and MaxValue must be "
            f"{'numbers' if kind == 'Continuous' else 'integers'}"
        ) from None
    if not low <= high:
        raise _invalid(f"{kind} parameter range {r['Name']}: MinValue must be <= MaxValue")
    scaling = r.get("ScalingType", "Auto")
    if scaling == "Logarithmic" and low <= 0:
        raise _invalid(f"parameter range {r['Name']}: Logarithmic scaling needs MinValue > 0")
    if scaling == "ReverseLogarithmic" and (kind != "Continuous" or not 0 <= low <= high < 1):
        raise _invalid(
            f"parameter range {r['Name']}: ReverseLogarithmic scaling is for continuous ranges "
            "within [0, 1)"
        )
    return low, high


def check_request(p: dict) -> None:
    """SageMaker's own rules for CreateHyperParameterTuningJob beyond the shape's."""
    if p.get("TrainingJobDefinitions"):
        raise _invalid("locally, a tuning job takes one TrainingJobDefinition (not several)")
    definition = p.get("TrainingJobDefinition")
    if not definition:
        raise _invalid("TrainingJobDefinition is required")
    config = p["HyperParameterTuningJobConfig"]
    objective = config.get("HyperParameterTuningJobObjective")
    if not objective:
        raise _invalid("HyperParameterTuningJobObjective is required")
    algorithm = definition["AlgorithmSpecification"]
    metrics = [m["Name"] for m in algorithm.get("MetricDefinitions") or []]
    if algorithm.get("TrainingImage") and objective["MetricName"] not in metrics:
        raise _invalid(
            f"The objective metric {objective['MetricName']!r} must be one of the "
            f"MetricDefinitions of the training image ({', '.join(metrics) or 'none given'})"
        )
    ranges = _ranges(config)
    names = [r["Name"] for kind in ranges for r in ranges[kind]]
    if not names:
        raise _invalid("ParameterRanges must hold at least one range to tune")
    if len(set(names)) != len(names):
        raise _invalid(f"ParameterRanges name a hyperparameter twice: {sorted(names)}")
    static = definition.get("StaticHyperParameters") or {}
    both = sorted(set(names) & set(static))
    if both:
        raise _invalid(f"{both} are both static and tuned hyperparameters")
    for kind in ("Continuous", "Integer"):
        for r in ranges[kind]:
            _bounds(kind, r)
    limits = config["ResourceLimits"]
    strategy = config["Strategy"]
    if strategy == "Grid":
        if ranges["Continuous"] or ranges["Integer"]:
            raise _invalid("the Grid strategy takes categorical parameter ranges only")
    elif "MaxNumberOfTrainingJobs" not in limits:
        raise _invalid(f"the {strategy} strategy needs ResourceLimits.MaxNumberOfTrainingJobs")
    total = trial_count(config)
    if limits["MaxParallelTrainingJobs"] > total:
        raise _invalid(
            f"MaxParallelTrainingJobs ({limits['MaxParallelTrainingJobs']}) must be at most "
            f"the number of training jobs ({total})"
        )


def trial_count(config: dict) -> int:
    limits = config["ResourceLimits"]
    if config["Strategy"] == "Grid":
        size = math.prod(len(r["Values"]) for r in _ranges(config)["Categorical"])
        return min(size, limits.get("MaxNumberOfTrainingJobs") or size)
    return limits["MaxNumberOfTrainingJobs"]


def _draw(kind: str, r: dict, rng: random.Random) -> str:
    if kind == "Categorical":
        return str(rng.choice(r["Values"]))
    low, high = _bounds(kind, r)
    scaling = r.get("ScalingType", "Auto")
    if scaling == "Auto":
        scaling = "Logarithmic" if low > 0 and high / low >= 10 else "Linear"
    u = rng.random()
    if scaling == "Logarithmic":
        value = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
    elif scaling == "ReverseLogarithmic":  # dense near 1: log-uniform in 1 - x
        a, b = math.log(1 - high), math.log(1 - low)
        value = 1 - math.exp(a + u * (b - a))
    else:
        value = low + u * (high - low)
    if kind == "Integer":
        return str(min(high, max(low, round(value))))
    return repr(float(value))


def draw(config: dict, rng: random.Random, index: int) -> dict[str, str]:
    """The tuned hyperparameters of trial `index` (0-based): a grid point, else random draws."""
    ranges = _ranges(config)
    if config["Strategy"] == "Grid":
        values: dict[str, str] = {}
        for r in reversed(ranges["Categorical"]):  # the first range varies slowest
            index, i = divmod(index, len(r["Values"]))
            values[r["Name"]] = str(r["Values"][i])
        return dict(reversed(values.items()))
    return {r["Name"]: _draw(kind, r, rng) for kind in ranges for r in ranges[kind]}


def training_request(tuning: dict, trial: str, tuned: dict[str, str]) -> dict:
    """CreateTrainingJob for one trial, from the tuning job's TrainingJobDefinition."""
    d = tuning["TrainingJobDefinition"]
    objective = tuning["HyperParameterTuningJobConfig"]["HyperParameterTuningJobObjective"]
    algorithm = {
        k: v
        for k, v in d["AlgorithmSpecification"].items()
        if k in ("TrainingImage", "AlgorithmName", "TrainingInputMode", "MetricDefinitions")
    }
    request = {
        k: d[k]
        for k in (
            "RoleArn",
            "InputDataConfig",
            "VpcConfig",
            "OutputDataConfig",
            "ResourceConfig",
            "StoppingCondition",
            "EnableNetworkIsolation",
            "EnableInterContainerTrafficEncryption",
            "EnableManagedSpotTraining",
            "CheckpointConfig",
            "RetryStrategy",
            "Environment",
        )
        if d.get(k) is not None
    }
    hyperparameters = {
        **(d.get("StaticHyperParameters") or {}),
        **tuned,
        "_tuning_objective_metric": objective["MetricName"],
    }
    return {
        **request,
        "TrainingJobName": trial,
        "AlgorithmSpecification": algorithm,
        "HyperParameters": hyperparameters,
    }


class TuningRunner(JobRunner):
    """Runs tuning jobs: launches, watches and ranks their training jobs."""

    kind, status_key = KIND, "HyperParameterTuningJobStatus"
    start_key, end_key = "_Started", "HyperParameterTuningEndTime"

    def __init__(self, api: LocalSageMaker, ctx: Context, poll_s: float = POLL_S):
        super().__init__(api, ctx)
        self.poll_s = poll_s

    def run(self, name: str, r: dict) -> dict:
        config = r["HyperParameterTuningJobConfig"]
        strategy = config["Strategy"]
        if strategy in RUN_AS_RANDOM:
            self.ctx.say(
                "job", f"{name}: the {strategy} strategy runs as random search on local SageMaker"
            )
        ignored = [k for k in ("WarmStartConfig", "Autotune") if r.get(k)] + [
            k for k in ("TuningJobCompletionCriteria", "StrategyConfig") if config.get(k)
        ]
        if config.get("TrainingJobEarlyStoppingType") == "Auto":
            ignored.append("TrainingJobEarlyStoppingType=Auto")
        if ignored:
            self.ctx.say("job", f"{name}: not applied on local SageMaker: {', '.join(ignored)}")
        total, parallel = trial_count(config), config["ResourceLimits"]["MaxParallelTrainingJobs"]
        rng = random.Random(config.get("RandomSeed", name))
        trials: list[dict] = list(r.get(TRIALS) or [])  # a resumed job keeps its trials
        for trial in trials:
            draw(config, rng, 0)  # the same draws as before the restart, in order
            if self.api.find("TrainingJob", trial["name"]) is None:  # saved, not yet created
                self.create_trial(r, trial)
        while not self.closing:
            jobs = {t["name"]: self.api.get("TrainingJob", t["name"]) for t in trials}
            running = [n for n, j in jobs.items() if j["TrainingJobStatus"] in RUNNING]
            if name in self.stopping:
                for trial in running:
                    if jobs[trial]["TrainingJobStatus"] == "InProgress":
                        self.api.call("StopTrainingJob", {"TrainingJobName": trial})
                if not running:
                    return self.summary(r, trials)
            elif len(trials) < total and len(running) < parallel:
                trials.append(self.launch(name, r, trials, draw(config, rng, len(trials))))
                continue
            elif not running:
                return self.summary(r, trials, final=True)
            self.api.update(KIND, name, **self.summary(r, trials))
            time.sleep(self.poll_s)
        return {}

    def launch(self, name: str, r: dict, trials: list[dict], tuned: dict) -> dict:
        trial = {"name": f"{name}-{len(trials) + 1:03d}-{secrets.token_hex(4)}", "tuned": tuned}
        # saved before the job exists: a restart never launches a trial twice or loses one
        self.api.update(KIND, name, **{TRIALS: [*trials, trial]})
        self.create_trial(r, trial)
        self.ctx.say("job", f"{name}: trial {trial['name']} with {tuned}")
        return trial

    def create_trial(self, r: dict, trial: dict) -> None:
        request = training_request(r, trial["name"], trial["tuned"])
        # the tuning job's tags go to every training job it launches, as on SageMaker
        request["Tags"] = self.api.tags.get(r["HyperParameterTuningJobArn"], [])
        self.api.call("CreateTrainingJob", request)
        self.api.update("TrainingJob", trial["name"], TuningJobArn=r["HyperParameterTuningJobArn"])

    def summary(self, r: dict, trials: list[dict], final: bool = False) -> dict:
        """Counters and the best trial so far; `final`: the job's outcome too."""
        summaries = [trial_summary(r, self.api.get("TrainingJob", t["name"]), t) for t in trials]
        zero = initial_fields(r)
        jobs, objectives = zero["TrainingJobStatusCounters"], zero["ObjectiveStatusCounters"]
        for s in summaries:
            status = s["TrainingJobStatus"]
            jobs[COUNTER.get(status, status)] += 1
            objectives[s["ObjectiveStatus"]] += 1
        changes: dict = {"TrainingJobStatusCounters": jobs, "ObjectiveStatusCounters": objectives}
        best = best_trial(r, summaries)
        if best is not None:
            changes["BestTrainingJob"] = best
        if final:
            if best is not None:
                changes[self.status_key] = "Completed"
            else:
                reasons = sorted({s.get("FailureReason", "no objective") for s in summaries})
                metric = objective_of(r)["MetricName"]
                changes[self.status_key] = "Failed"
                changes["FailureReason"] = (
                    f"No training job reported the objective metric {metric}: {'; '.join(reasons)}"
                )[:1024]
        return changes


RUNNING = ("InProgress", "Stopping")
COUNTER = {"Failed": "NonRetryableError", "Stopping": "InProgress"}


def objective_of(r: dict) -> dict:
    return r["HyperParameterTuningJobConfig"]["HyperParameterTuningJobObjective"]


def trial_summary(r: dict, job: dict, trial: dict) -> dict:
    """A trial as SageMaker's HyperParameterTrainingJobSummary."""
    objective = objective_of(r)
    summary = {
        "TrainingJobName": job["TrainingJobName"],
        "TrainingJobArn": job["TrainingJobArn"],
        "TuningJobName": r["HyperParameterTuningJobName"],
        "CreationTime": job["CreationTime"],
        "TrainingJobStatus": job["TrainingJobStatus"],
        "TunedHyperParameters": trial["tuned"],
        "ObjectiveStatus": "Pending",
    }
    for key in ("TrainingStartTime", "TrainingEndTime", "FailureReason"):
        if job.get(key) is not None:
            summary[key] = job[key]
    if job["TrainingJobStatus"] in RUNNING:
        return summary
    values = [
        m["Value"]
        for m in job.get("FinalMetricDataList") or []
        if m["MetricName"] == objective["MetricName"]
    ]
    if job["TrainingJobStatus"] == "Completed" and values and math.isfinite(values[-1]):
        summary["ObjectiveStatus"] = "Succeeded"
        summary["FinalHyperParameterTuningJobObjectiveMetric"] = {
            "MetricName": objective["MetricName"],
            "Value": values[-1],
            "Type": objective["Type"],
        }
    else:
        summary["ObjectiveStatus"] = "Failed"
    return summary


def best_trial(r: dict, summaries: list[dict]) -> dict | None:
    scored = [s for s in summaries if s["ObjectiveStatus"] == "Succeeded"]
    if not scored:
        return None
    sign = -1 if objective_of(r)["Type"] == "Maximize" else 1
    return min(
        scored, key=lambda s: sign * s["FinalHyperParameterTuningJobObjectiveMetric"]["Value"]
    )


def initial_fields(record: dict) -> dict:
    """What Describe and List answer before any trial: zero counters, the config's strategy."""
    config = record["HyperParameterTuningJobConfig"]
    return {
        "Strategy": config["Strategy"],
        "ResourceLimits": config["ResourceLimits"],
        "TrainingJobStatusCounters": dict.fromkeys(
            ("Completed", "InProgress", "RetryableError", "NonRetryableError", "Stopped"), 0
        ),
        "ObjectiveStatusCounters": dict.fromkeys(("Succeeded", "Pending", "Failed"), 0),
    }


def list_trials(r: dict, api: LocalSageMaker, p: dict) -> dict:
    """ListTrainingJobsForHyperParameterTuningJob: SortBy Name (default), CreationTime, Status
    or FinalObjectiveMetricValue (which leaves out trials without one), Ascending by default."""
    summaries = []
    for trial in r.get(TRIALS) or []:
        job = api.find("TrainingJob", trial["name"])
        if job is not None:
            summaries.append(trial_summary(r, job, trial))
    if p.get("StatusEquals"):
        summaries = [s for s in summaries if s["TrainingJobStatus"] == p["StatusEquals"]]
    by = p.get("SortBy", "Name")
    if by == "FinalObjectiveMetricValue":
        summaries = [s for s in summaries if "FinalHyperParameterTuningJobObjectiveMetric" in s]
    key = {
        "Name": lambda s: s["TrainingJobName"],
        "CreationTime": lambda s: s["CreationTime"],
        "Status": lambda s: s["TrainingJobStatus"],
        "FinalObjectiveMetricValue": lambda s: s["FinalHyperParameterTuningJobObjectiveMetric"][
            "Value"
        ],
    }[by]
    summaries.sort(key=key, reverse=p.get("SortOrder", "Ascending") == "Descending")
    start, size = int(p.get("NextToken") or 0), int(p.get("MaxResults") or 10)
    out: dict = {"TrainingJobSummaries": summaries[start : start + size]}
    if start + size < len(summaries):
        out["NextToken"] = str(start + size)
    return out
