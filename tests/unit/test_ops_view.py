"""The ops view in template.yaml: every metric the dashboard plots and every alarm reads is one
the functions or an AWS service really emit, with those dimensions naming Sluice's resources;
every alarm pages the topic and names the runbook section that says what to do."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from cfnlint.decode import cfn_yaml

from sluice_local import aws_rules

REPO = Path(__file__).resolve().parents[2]
T = cfn_yaml.load(str(REPO / "template.yaml"))
R = T["Resources"]
SUB = {"Stage": "dev", "AWS::Region": "us-east-1", "AWS::Partition": "aws"}
SUB["AWS::AccountId"] = "123456789012"
NAMESPACE = T["Globals"]["Function"]["Environment"]["Variables"]["POWERTOOLS_METRICS_NAMESPACE"]

# Metrics AWS services publish, with the dimensions Sluice filters them by.
AWS_METRICS = {
    # SageMaker developer guide, "Amazon SageMaker AI metrics in Amazon CloudWatch" (endpoints)
    "AWS/SageMaker": (
        {"Invocations", "Invocation4XXErrors", "Invocation5XXErrors", "ModelLatency"},
        {"EndpointName", "VariantName"},
    ),
    # SQS developer guide, "Available CloudWatch metrics for Amazon SQS"
    "AWS/SQS": (
        {
            "ApproximateNumberOfMessagesVisible",
            "ApproximateNumberOfMessagesDelayed",
            "ApproximateAgeOfOldestMessage",
        },
        {"QueueName"},
    ),
    # Lambda developer guide, "Types of metrics for Lambda functions"
    "AWS/Lambda": ({"Errors", "Throttles", "Duration", "ConcurrentExecutions"}, {"FunctionName"}),
    # Step Functions developer guide, "Monitoring Step Functions metrics using CloudWatch"
    "AWS/States": (
        {
            "ExecutionsStarted",
            "ExecutionsSucceeded",
            "ExecutionsFailed",
            "ExecutionsTimedOut",
            "ExecutionsAborted",
            "ExecutionTime",
        },
        {"StateMachineArn"},
    ),
}
# Emitted on purpose but not plotted, and why.
LEFT_OUT = {
    "container: feature_baseline_drift_<feature>, violations": "Model Monitor writes them only "
    "for monitoring-schedule runs; the dashboard plots DriftViolations, which every run emits",
}


def sub(value) -> str:
    """A dimension value as CloudFormation resolves it, for Stage dev in us-east-1."""
    if isinstance(value, str):
        return value
    if "Fn::Sub" in value:
        return re.sub(r"\$\{([\w:]+)\}", lambda m: SUB[m[1]], value["Fn::Sub"])
    if "Fn::GetAtt" in value:
        rid, attr = value["Fn::GetAtt"]
        assert attr == "QueueName", value
        return sub(R[rid]["Properties"]["QueueName"])
    rid = value["Ref"]
    if R[rid]["Type"] == "AWS::Serverless::StateMachine":
        name = sub(R[rid]["Properties"]["Name"])
        return f"arn:aws:states:us-east-1:123456789012:stateMachine:{name}"
    return sub(R[rid]["Properties"]["FunctionName"])


def resources_named(field: str) -> set[str]:
    return {sub(r["Properties"][field]) for r in R.values() if field in r.get("Properties", {})}


# what a dimension's value must name: one of Sluice's resources
REAL = {
    "QueueName": resources_named("QueueName"),
    "FunctionName": resources_named("FunctionName"),
    "StateMachineArn": {sub({"Ref": "RetrainStateMachine"})},
    "EndpointName": {sub(T["Outputs"]["EndpointName"]["Value"])},
    "VariantName": {"AllTraffic"},
}


def emitted_metrics() -> set[tuple[str, str]]:
    """(service, metric) for every metric a function adds: Powertools' one dimension is
    `service` = the emitting function's POWERTOOLS_SERVICE_NAME."""
    services: dict[str, set[str]] = {}
    for fn in R.values():
        if fn["Type"] == "AWS::Serverless::Function":
            module = fn["Properties"]["Handler"].split(".")[1]
            env = fn["Properties"]["Environment"]["Variables"]
            services.setdefault(module, set()).add(env["POWERTOOLS_SERVICE_NAME"])
    out = set()
    for path in (REPO / "functions" / "sluice_functions").glob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_metric":
                first = node.args[0]
                choices = [first.body, first.orelse] if isinstance(first, ast.IfExp) else [first]
                names |= {c.value for c in choices if isinstance(c, ast.Constant)}
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "JOB_METRICS":
                names |= {row.elts[0].value for row in node.value.elts}
        out |= {(s, n) for s in services.get(path.stem, ()) for n in names}
    return out


EMITTED = emitted_metrics()


def check_metric(namespace: str, name: str, dims: dict[str, str]) -> None:
    if namespace == NAMESPACE:
        assert set(dims) == {"service"} and (dims["service"], name) in EMITTED, (name, dims)
        return
    names, dimensions = AWS_METRICS[namespace]
    assert name in names and set(dims) == dimensions, (namespace, name, dims)
    for key, value in dims.items():
        assert value in REAL[key], f"{namespace} {name}: {key}={value} names nothing Sluice has"


def dashboard() -> dict:
    body = R["OpsDashboard"]["Properties"]["DashboardBody"]
    return json.loads(sub(body))


def plotted() -> list[tuple[str, str, dict[str, str]]]:
    out = []
    for w in dashboard()["widgets"]:
        for row in w["properties"].get("metrics", []):
            strings = [x for x in row if isinstance(x, str)]
            dims = dict(zip(strings[2::2], strings[3::2], strict=True))
            out.append((strings[0], strings[1], dims))
    return out


def test_the_dashboard_is_valid_as_cloudwatch_reads_it():
    body = sub(R["OpsDashboard"]["Properties"]["DashboardBody"])
    assert aws_rules.problems("cloudwatch", "PutDashboard", {"DashboardBody": body}) == []
    assert sub(R["OpsDashboard"]["Properties"]["DashboardName"]) == "sluice-dev"
    titles = [w["properties"].get("title") for w in dashboard()["widgets"]]
    for title in ("Transform jobs", "Dead-letter queues (messages)", "Retrain executions"):
        assert title in titles


def test_every_plotted_metric_is_emitted_and_every_emitted_one_plotted_or_left_out():
    shown = plotted()
    for namespace, name, dims in shown:
        check_metric(namespace, name, dims)
    missing = EMITTED - {(d["service"], n) for ns, n, d in shown if ns == NAMESPACE}
    assert not missing, f"emitted but neither plotted nor in LEFT_OUT: {sorted(missing)}"
    # every queue's dead letters, every function's errors are on it
    dlqs = {d["QueueName"] for _, n, d in shown if n == "ApproximateNumberOfMessagesVisible"}
    assert {q for q in REAL["QueueName"] if q.endswith("-dlq")} <= dlqs
    errors = {d["FunctionName"] for _, n, d in shown if n == "Errors"}
    assert errors == REAL["FunctionName"]
    # what is left out is still emitted (else the reason is stale)
    monitor = (REPO / "container" / "sluice" / "monitor.py").read_text()
    assert '"feature_baseline_drift_' in monitor and '"violations"' in monitor, LEFT_OUT


def alarm_metrics(p: dict) -> list[tuple[str, str, dict[str, str]]]:
    """The metrics an alarm reads: its own, or its metric math's."""
    if "Metrics" not in p:
        dims = {d["Name"]: sub(d["Value"]) for d in p.get("Dimensions", [])}
        return [(p["Namespace"], p["MetricName"], dims)]
    out = []
    for query in p["Metrics"]:
        if "MetricStat" in query:
            m = query["MetricStat"]["Metric"]
            dims = {d["Name"]: sub(d["Value"]) for d in m.get("Dimensions", [])}
            out.append((m["Namespace"], m["MetricName"], dims))
        else:
            ids = set(re.findall(r"\b[a-z]\w*\b", query["Expression"])) - {"total"}
            known = {q["Id"] for q in p["Metrics"]}
            assert ids - {"FILL", "MAX", "SUM"} <= known, query["Expression"]
    return out


ALARMS = [n for n, r in R.items() if r["Type"] == "AWS::CloudWatch::Alarm"]


@pytest.mark.parametrize("name", ALARMS)
def test_every_alarm_reads_a_metric_something_emits_with_those_dimensions(name):
    """Powertools adds one dimension, `service` = the function's POWERTOOLS_SERVICE_NAME: an
    alarm filtering on any other value (DriftAlarm's `retrain-trigger`) never fires."""
    for namespace, metric, dims in alarm_metrics(R[name]["Properties"]):
        check_metric(namespace, metric, dims)


ROLLBACK = {"EndpointErrorsAlarm", "EndpointLatencyAlarm"}  # read by SageMaker's blue/green


@pytest.mark.parametrize("name", sorted(set(ALARMS) - ROLLBACK))
def test_every_paging_alarm_notifies_and_names_a_runbook_section_that_exists(name):
    p = R[name]["Properties"]
    assert p["AlarmActions"] == [{"Ref": "NotificationTopic"}]
    assert p["TreatMissingData"] == "notBreaching"  # no data: nothing happened
    if name in ("DriftAlarm", "MonitoringFailuresAlarm"):
        return  # the drift report itself says what to do
    doc, anchor = re.search(r"Runbook: (docs/[\w.]+)#([\w-]+)", p["AlarmDescription"]).groups()
    headings = re.findall(r"^#+ (.+)$", (REPO / doc).read_text(), re.M)
    slugs = {re.sub(r"[^\w -]", "", h).strip().lower().replace(" ", "-") for h in headings}
    assert anchor in slugs, (doc, anchor, sorted(slugs))


def test_the_pages_an_on_call_engineer_needs_are_there():
    pages = {R[n]["Properties"]["AlarmName"]["Fn::Sub"].split("}-", 1)[1] for n in ALARMS}
    assert {
        "dead-letters",
        "transform-jobs-failed",
        "batches-given-up",
        "incoming-stuck",
        "retrain-failed",
        "function-errors",
        "function-throttles",
    } <= pages
    dlq = alarm_metrics(R["DeadLetterMessagesAlarm"]["Properties"])
    assert {d["QueueName"] for _, _, d in dlq} == {
        q for q in REAL["QueueName"] if q.endswith("-dlq")
    }
