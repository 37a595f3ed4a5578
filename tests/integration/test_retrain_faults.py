"""Fault injection over the retraining state machine: every Task state, every failure it can meet,
once and persistently; every end state must be one the design allows (docs/retraining.md).

The definition runs unchanged in the local interpreter (tests/retrain_harness.py). A failure is
injected where Step Functions meets it, at the service call of the named state, and named as
Step Functions names it (sluice_local.moto_fixes): throttling, a validation error and a service
error are refused before the call takes effect; a timeout strikes after the call has taken effect,
the case a state machine most easily gets wrong (the update happened, the state thinks it did not).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import pytest
import yaml
from botocore.exceptions import ClientError
from moto import mock_aws

from tests import retrain_harness as h
from tests.helpers import FIGURES

pytestmark = pytest.mark.usefixtures("strict_aws")

# code, HTTP status; None: a timeout after the call took effect
KINDS = {
    "throttling": ("ThrottlingException", 400),
    "validation": ("ValidationException", 400),
    "service": ("InternalFailure", 500),
    "timeout": None,
}
MODES = {"once": 1, "persistent": 10_000}

# Which run reaches each Task state: champion serving and challenger better (update), no champion
# (first), challenger worse (reject), a deployment SageMaker rolls back (rollback), a training
# job that never ends (slow), a one-instance endpoint (one-instance), a changed instance type
# under auto scaling (new-type); states that only run after another failed get that failure too.
REACHED_BY = {
    "CreateEndpoint": ("first", {}),
    "RegisterRejected": ("reject", {}),
    "NotifyRejected": ("reject", {}),
    "RejectUndeployed": ("rollback", {}),
    "NotifyFailure": ("rollback", {}),
    "StopTraining": ("slow", {}),
    "Tune": ("tuned", {}),
    "DescribeBestTrial": ("tuned", {}),
    "StopTuning": ("slow-tuning", {}),
    "ReadBatchPointer": ("update", {"PointBatchAtModel": "validation"}),
    "ReadApproval": ("update", {"Approve": "validation"}),
    # an endpoint of one instance swaps all at once; a changed instance type deregisters first
    "UpdateEndpointAllAtOnce": ("one-instance", {}),
    "DeregisterScalableTarget": ("new-type", {}),
}

# (registry status of the challenger, what the endpoint serves, what batch names, report outcome)
ALLOWED = {
    ("Approved", "challenger", "challenger", "promoted"),
    ("Rejected", "champion", "champion", "rejected"),
    # failed before registration: nothing moved
    (None, "champion", "champion", "failed"),
    # not deployed: the endpoint kept (or never had) the champion
    ("Rejected", "champion", "champion", "failed"),
    # not deployed and the rejection could not be recorded, or the swap never settled while the
    # endpoint still served the champion: pending, for an operator
    ("PendingManualApproval", "champion", "champion", "failed"),
    # the swap never settled (the endpoint is mid-update, failed to roll back, ...)
    ("PendingManualApproval", "unsettled", "champion", "failed"),
    # served, but a step after the swap failed or could not be confirmed: never rejected, batch
    # never ahead of the endpoint
    ("Approved", "challenger", "champion", "failed"),
    ("Approved", "challenger", "challenger", "failed"),
    ("PendingManualApproval", "challenger", "challenger", "failed"),
    ("PendingManualApproval", "challenger", "champion", "failed"),
}

# errors a report may name besides the injected one (what the state machine concluded from it)
CONCLUSIONS = {
    "TrainingFailed",
    "TrainingTimedOut",
    "TuningFailed",
    "TuningTimedOut",
    "NoGateFigures",
    "EndpointRolledBack",
    "EndpointFailed",
    "EndpointNotCreated",
    "EndpointUnsettled",
    "EndpointBusy",
    "PromotedIncompletely",
    "RetrainFailed",
}


def task_states() -> list[str]:
    """Every Task state of the definition, branches included."""
    doc = yaml.safe_load(h.DEFINITION.read_text())
    found: list[str] = []

    def walk(states: dict) -> None:
        for name, state in states.items():
            if state["Type"] == "Task":
                found.append(name)
            for branch in state.get("Branches", []):
                walk(branch["States"])

    walk(doc["States"])
    return found


@dataclass
class Fault:
    state: str
    kind: str
    left: int
    error_name: str = ""
    hits: int = 0


def install_injector(monkeypatch, faults: dict[str, Fault]) -> None:
    """Fail the named states' service calls as Step Functions would meet the failures."""
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import (
        FailureEventException,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import (
        state_task_service_aws_sdk,
        state_task_service_sns,
    )

    from sluice_local.moto_fixes import sagemaker_task_class

    for cls in (
        state_task_service_aws_sdk.StateTaskServiceAwsSdk,
        state_task_service_sns.StateTaskServiceSns,
        sagemaker_task_class(),
    ):
        call = cls._eval_service_task

        def injected(self, env, *args, _call=call, **kwargs):
            state = env.states.context_object.context_object_data["State"]["Name"]
            fault = faults.get(state)
            if fault is None or fault.left <= 0:
                return _call(self, env, *args, **kwargs)
            fault.left -= 1
            fault.hits += 1
            if KINDS[fault.kind] is None:
                fault.error_name = "States.Timeout"
                _call(self, env, *args, **kwargs)  # it happened; the answer never came
                raise FailureEventException(self._get_timed_out_failure_event(env))
            code, status = KINDS[fault.kind]
            error = ClientError(
                {
                    "Error": {"Code": code, "Message": f"injected {fault.kind} in {state}"},
                    "ResponseMetadata": {"HTTPStatusCode": status, "RequestId": "injected"},
                },
                self._get_boto_service_action(),
            )
            # the name this integration gives it (what a Retry or Catch, and the report, see)
            details = self._from_error(env, error).event_details["taskFailedEventDetails"]
            fault.error_name = details["error"]
            raise error

        monkeypatch.setattr(cls, "_eval_service_task", injected)


def sm():
    return h.client("sagemaker")


def end_state(d: dict, world: dict, execution: str) -> tuple[tuple, dict]:
    """(registry, endpoint, batch, outcome) as the world shows it, and the report."""
    job = f"sluice-{h.STAGE}-" + hashlib.md5(execution.encode()).hexdigest()
    listed = sm().list_model_packages(ModelPackageGroupName=h.GROUP)["ModelPackageSummaryList"]
    statuses = [p["ModelApprovalStatus"] for p in listed]
    registry = statuses[0] if len(statuses) == 1 else (None if not statuses else tuple(statuses))
    try:
        ep = sm().describe_endpoint(EndpointName=h.ENDPOINT)
    except ClientError:
        ep = None
    if ep is None:
        endpoint = "champion"  # none: a first model that was not deployed
    elif ep["EndpointStatus"] != "InService":
        endpoint = "unsettled"
    else:
        endpoint = "challenger" if ep["EndpointConfigName"] == job else "champion"
    batch_now = h.client("ssm").get_parameter(Name=h.PARAM)
    batch = "challenger" if batch_now["Parameter"]["Value"] == job else "champion"
    notes = h.notifications(world)
    # SNS is at-least-once and a timed-out publish is retried: copies, never different reports
    assert len({json.dumps(n, sort_keys=True) for n in notes}) <= 1, notes
    if notes:
        report = notes[0]
    elif d["status"] == "SUCCEEDED":  # the topic refused: the execution's output is the report
        report = json.loads(d["output"])
    else:
        report = {"outcome": "failed", "error": d.get("error"), "cause": d.get("cause")}
    return (registry, endpoint, batch, report["outcome"]), report


def run_once(monkeypatch, aws, state: str, kind: str, mode: str) -> tuple[tuple, Fault, str | None]:
    """One execution in a fresh world: (end state, the fault, what is wrong with its end)."""
    scenario, background = REACHED_BY.get(state, ("update", {}))
    fault = Fault(state, kind, MODES[mode])
    faults = {s: Fault(s, k, MODES["persistent"]) for s, k in background.items()}
    faults[state] = fault
    aws.reset()  # every backend empty; the mock (and botocore's loaded models) stay
    with monkeypatch.context() as mp:
        sim = h.SimulatedSageMaker()
        sim.install(mp)
        install_injector(mp, faults)
        world = h.create_world()
        overrides = {
            "slow": {"TrainingTimeoutSeconds": 1},
            "tuned": {"TuningStrategy": "Random"},
            "slow-tuning": {"TuningStrategy": "Random", "TuningTimeoutSeconds": 1},
        }.get(scenario, {})
        arn = h.create_state_machine(world, **overrides)
        if scenario == "one-instance":
            h.install_champion(instances=1)
        elif scenario == "new-type":
            h.install_champion(instance_type="ml.m5.xlarge")
            h.client("application-autoscaling").register_scalable_target(
                ServiceNamespace="sagemaker",
                ResourceId=f"endpoint/{h.ENDPOINT}/variant/AllTraffic",
                ScalableDimension="sagemaker:variant:DesiredInstanceCount",
                MinCapacity=1,
                MaxCapacity=4,
            )
        elif scenario != "first":
            h.install_champion()
        sim.metrics = {"gate_challenger": 30.0, "gate_baseline": 40.0, "gate_improvement": 0.25}
        if scenario == "first":
            sim.metrics = {"gate_challenger": 30.0}
        if scenario == "reject":
            sim.metrics["gate_improvement"] = 0.0
        if scenario == "rollback":
            sim.deployment = "RolledBack"
        if scenario == "slow":
            sim.training = "InProgress"
        sim.trials = [{**sim.metrics, "validation_loss": v} for v in (3.5, 3.1)]
        if scenario == "slow-tuning":
            sim.tuning = "InProgress"
        name = f"{state}-{kind}-{mode}"
        d = h.run(arn, name, {"reason": "manual"}, timeout_s=120)
        got, report = end_state(d, world, name)
        problem = judge(got, report, fault)
        # the execution's story (its history, read before the next run resets the world) only
        # where a problem needs telling: reading it was a sixth of the sweep's time
        return got, fault, problem and f"{state} {kind} {mode}: {got} {h.explain(d)}: {problem}"


def judge(got: tuple, report: dict, fault: Fault) -> str | None:
    """What is wrong with one run's end, or None."""
    if fault.hits == 0:
        return f"the run never reached {fault.state}"
    if got not in ALLOWED:
        return "not an allowed end state"
    if got[3] == "failed" and not (report.get("error") and report.get("cause")):
        return f"the report does not say what failed: {report}"
    if got[3] == "failed" and not (
        report["error"] in CONCLUSIONS or report["error"] == fault.error_name
    ):
        return f"the report names {report['error']}, not what happened"
    return None


@pytest.mark.slow
def test_every_task_state_under_every_failure_ends_in_an_allowed_state(monkeypatch):
    h.aws_env(monkeypatch)
    states = task_states()
    problems: list[str] = []
    runs = 0
    aws = mock_aws(config={"stepfunctions": {"execute_state_machine": True}})
    aws.start()
    try:
        outcomes = [
            (state, kind, mode, run_once(monkeypatch, aws, state, kind, mode))
            for state in states
            for kind in KINDS
            for mode in MODES
        ]
    finally:
        aws.stop()
    for _, _, _, (_, _, problem) in outcomes:
        runs += 1
        if problem:
            problems.append(problem)
    names = sorted({f.error_name for *_, (_, f, _) in outcomes})
    FIGURES.append("retraining fault injection: error names injected: " + ", ".join(names))
    figure = (
        f"retraining fault injection: {len(states)} Task states x {len(KINDS)} failure kinds x "
        f"{len(MODES)} (once, persistent) = {runs} runs; end states allowed: "
        f"{runs - len(problems)}/{runs}"
    )
    FIGURES.append(figure)
    assert not problems, figure + "\n" + "\n".join(problems)
