"""Local Sluice end to end: `sluice-local up` as a user runs it, driven with boto3 and the
SageMaker Python SDK over its one endpoint.

The flows build on each other, in order, on one stack (as a team's day would): new training
data trains and promotes a first model; uploads become predictions beside a _SUCCESS.json (and a
failing file a _FAILURE.json and a notification); the endpoint answers boto3 and the SDK; drift
retrains and swaps the model, and batch then uses it; a restart keeps everything.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest

from sluice_local.corpus import generate
from tests.helpers import chromium, hp, running_stack

pytestmark = pytest.mark.slow

# small enough for CI's two cores; the template's other local values come from samconfig.toml
TRAINING = hp(max_steps=60, n_positions=64, block_size=32, vocab_size=384)
# WarmStart: the drift retrain fine-tunes the champion from its model.tar.gz, as SageMaker fills
# the baseline channel (a path that once failed on every real champion)
OVERRIDES = [
    f"TrainingHyperparameters={json.dumps(TRAINING)}",
    "EdgeSequenceLength=32",
    "WarmStart=true",
]
# an account that may run one transform instance at a time: batches that arrive while a job
# runs wait for it (in the queue, not the DLQ); and SageMaker finds no instances for the first
# transform job (CapacityError): its uploads wait too, and run in the next job
QUOTA = ("--quota", "ml.g5.xlarge for transform job usage=1", "--no-capacity", "ml.g5.xlarge=1")


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    yield from running_stack(tmp_path_factory, "local", OVERRIDES, QUOTA)


@pytest.fixture(scope="module")
def champion(local) -> str:
    """New training data -> retrain -> the first model, promoted (flow 2's first half)."""
    users = local.users
    for i in (1, 2):  # RetrainMinObjects=2 locally
        users.put(f"training/animals-{i}.txt", generate(1500, seed=i))
    name = users.wait_for("the first promotion", users.champion, 900)
    # its drift baseline (started after the swap) is what drift checks compare with
    users.wait_for(
        "the champion's baseline",
        lambda: users.keys(f"monitoring/baseline/{name}/statistics.json"),
        300,
    )
    return name


def test_new_training_data_trains_and_promotes_a_first_model(local, champion):
    ex = local.execution("new-data-")
    assert ex["status"] == "SUCCEEDED", ex
    out = json.loads(ex["output"])
    assert out["outcome"] == "promoted" and out["trainingJob"] == champion
    sm = local.client("sagemaker")
    job = sm.describe_training_job(TrainingJobName=champion)
    assert job["TrainingJobStatus"] == "Completed"
    assert {m["MetricName"] for m in job["FinalMetricDataList"]} >= {
        "gate_challenger",
        "train_loss",
    }
    assert [c["ChannelName"] for c in job["InputDataConfig"]] == ["train"]
    endpoint = sm.describe_endpoint(EndpointName=local.users.endpoint)
    assert endpoint["EndpointStatus"] == "InService"
    assert endpoint["EndpointConfigName"] == champion
    [package] = sm.list_model_packages(
        ModelPackageGroupName=local.status["outputs"]["ModelPackageGroupName"]
    )["ModelPackageSummaryList"]
    assert package["ModelApprovalStatus"] == "Approved"
    edge = sm.describe_compilation_job(CompilationJobName=champion)
    assert edge["CompilationJobStatus"] == "COMPLETED"
    assert edge["ModelArtifacts"]["S3ModelArtifacts"].endswith("model-ml_c5.tar.gz")


def test_uploads_become_predictions_beside_a_success_report(local, champion):
    users = local.users
    prompts = [
        {"id": f"p{i}", "text": t, "parameters": {"max_new_tokens": 4}}
        for i, t in enumerate(["The lazy cat eats", "In the desert there is often"])
    ]
    users.put("incoming/team-a/prompts.jsonl", [json.dumps(p) for p in prompts] + ["{oops"])
    users.put("incoming/team-a/notes.txt", ["Every horse likes", "Anna gave the dog some"])
    # the OpenAI batch format, recognised by content: output lines and an error file in its shape
    completion = {"prompt": "The lazy cat eats", "max_tokens": 4, "temperature": 0}
    openai = [
        {"custom_id": "c-1", "method": "POST", "url": "/v1/completions", "body": completion},
        {"custom_id": "c-2", "method": "POST", "url": "/v1/embeddings", "body": {"input": "a"}},
    ]
    users.put("incoming/team-a/batch.jsonl", [json.dumps(x) for x in openai])
    names = ["prompts.jsonl", "notes.txt", "batch.jsonl"]
    reports = users.wait_for_reports([f"incoming/team-a/{n}" for n in names])
    # one batching window, one job per content type: JSON Lines, and plain text (a prompt a line)
    assert len(reports) == 2
    # the stack's first job found no capacity: its uploads waited and are in a completed job
    [waited] = [k for k in users.keys("outputs/") if k.endswith("/_WAITING.json")]
    waiting = json.loads(users.read(waited))
    assert waiting["reason"].startswith("CapacityError") and waiting["uploads"]
    assert set(waiting["uploads"]) <= {i for r in reports.values() for i in r["inputs"]}
    files = {f["input"].rsplit("/", 1)[1]: (r, f) for r in reports.values() for f in r["outputs"]}
    assert sorted(files) == sorted(names)
    assert files["prompts.jsonl"][0] is files["batch.jsonl"][0]
    for report, _ in files.values():
        assert report["status"] == "Completed" and report["model"] == champion
    counts = {n: (f["records"], f["error_lines"]) for n, (_, f) in files.items()}
    assert counts == {"prompts.jsonl": (3, 1), "notes.txt": (2, 0), "batch.jsonl": (2, 1)}
    for name, (report, f) in files.items():  # README's path: the input's, under outputs/<job>/
        assert f["output"].split("/", 3)[3] == f"outputs/{report['job']}/team-a/{name}.out"
    out = files["prompts.jsonl"][1]["output"].split("/", 3)[3]
    lines = [json.loads(x) for x in users.read(out).splitlines()]
    assert [x.get("id") for x in lines] == ["p0", "p1", None]  # one line per input, in order
    assert lines[0]["generated_text"] and lines[2]["error"]["code"] == "invalid_json"
    out = files["batch.jsonl"][1]["output"].split("/", 3)[3]
    done, refused = [json.loads(x) for x in users.read(out).splitlines()]
    body = done["response"]["body"]
    assert done["custom_id"] == "c-1" and body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    assert refused["response"]["status_code"] == 400
    errors = files["batch.jsonl"][1]["errors"].split("/", 3)[3]
    assert errors == out.removesuffix(".out") + ".errors.jsonl"
    assert [json.loads(x)["custom_id"] for x in users.read(errors).splitlines()] == ["c-2"]
    # usage: each output's tokens are its lines' usage, each job's the sum, priced per instance
    for report, f in files.values():
        got = [json.loads(x) for x in users.read(f["output"].split("/", 3)[3]).splitlines()]
        used = [x.get("usage") or x.get("response", {}).get("body", {}).get("usage") for x in got]
        assert f["input_tokens"] == sum(u["prompt_tokens"] for u in used if u) > 0
        assert f["output_tokens"] == sum(u["completion_tokens"] for u in used if u) > 0
        assert report["input_tokens"] == sum(x["input_tokens"] for x in report["outputs"])
        assert report["instance_seconds"] > 0 and report["cost"]["usd"] > 0, report


def test_batches_beyond_the_quota_wait_and_all_complete(local, champion):
    """Quota 1 instance, three bursts of 25 uploads arriving while the first job runs: every
    upload in exactly one report with its one output line, never two jobs at once, nothing in
    the DLQ (waiting does not count receives). The CI-sized form of benchmarks/scale.py."""
    users = local.users
    bursts = [[f"incoming/quota/burst-{b}/file-{i:02d}.jsonl" for i in range(25)] for b in range(3)]
    keys = [k for burst in bursts for k in burst]
    record = {"text": "The lazy cat eats", "parameters": {"max_new_tokens": 2}}
    with ThreadPoolExecutor(8) as pool:  # a burst lands well within the 2 s batching window
        for b, burst in enumerate(bursts):
            if b:
                time.sleep(3)  # past the window: a batch (and a job) each
            list(pool.map(lambda k: users.put(k, [json.dumps({"id": k, **record})]), burst))
    reports = users.wait_for_reports(keys)
    # the first batch's job, then the waiting ones: apart, or coalesced when they come back
    # from waiting in one batch (both happen, by when the poller receives them); a burst the
    # poller happens to split makes one more
    assert 2 <= len(reports) <= 6
    assert all(r["status"] == "Completed" for r in reports.values())
    seen = Counter(i for r in reports.values() for i in r["inputs"])
    assert seen == Counter(f"s3://{users.bucket}/{k}" for k in keys)  # each once
    by_input = {i: r["job"] for r in reports.values() for i in r["inputs"]}
    for k in keys:
        out = users.read(f"outputs/{by_input[f's3://{users.bucket}/{k}']}/{k[9:]}.out")
        [line] = [json.loads(x) for x in out.splitlines()]
        assert line["id"] == k and "generated_text" in line, line
    sm = local.client("sagemaker")
    spans = sorted(
        (j["CreationTime"], j["TransformEndTime"])
        for j in (sm.describe_transform_job(TransformJobName=r["job"]) for r in reports.values())
    )
    for (_, ended), (created, _) in itertools.pairwise(spans):
        assert created >= ended, spans  # one instance: a job starts after the previous ended
    log = (local.state / "logs" / "functions" / "sluice-local-start-transform.log").read_text()
    assert "cannot start yet" in log and "ResourceLimitExceeded" in log
    sqs = local.client("sqs")
    dlq = sqs.get_queue_attributes(
        QueueUrl=local.status["outputs"]["IncomingDeadLetterQueueUrl"],
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    assert dlq == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}


def test_a_failing_file_gets_a_failure_report_and_a_notification(local, champion):
    users = local.users
    huge = json.dumps({"text": "x " * (600 * 1024)})  # one record over MaxPayloadInMB=1
    users.put("incoming/team-a/huge.jsonl", [huge])
    [report] = users.wait_for_reports(["incoming/team-a/huge.jsonl"]).values()
    assert report["status"] == "Failed" and "MaxPayloadInMB" in report["reason"]
    notes = json.loads(_get(local.endpoint, "/_sluice/notifications"))
    assert any(n["subject"].startswith("Sluice transform failed") for n in notes)


def test_alarms_page_for_a_failed_job_and_for_dead_letters(local, champion):
    """The local CloudWatch evaluates template.yaml's alarms on what the stack emits: the failed
    job above (JobsFailed) and a message on each DLQ (SQS's queue metrics) page the topic."""
    sqs, cw = local.client("sqs"), local.client("cloudwatch")
    dlqs = [
        sqs.get_queue_url(QueueName=f"sluice-local-{q}")["QueueUrl"]
        for q in ("incoming-dlq", "transform-finished-dlq", "training-dlq", "drift-signals-dlq")
    ]
    for url in dlqs:
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"test": "alarm"}))

    def paged() -> list[str] | None:
        notes = json.loads(_get(local.endpoint, "/_sluice/notifications"))
        subjects = [n["subject"] for n in notes if n["subject"].startswith("ALARM:")]
        wanted = ("sluice-local-dead-letters", "sluice-local-transform-jobs-failed")
        return subjects if all(any(f'"{w}"' in s for s in subjects) for w in wanted) else None

    subjects = local.users.wait_for("the alarms to page", paged, 90)
    assert 'ALARM: "sluice-local-dead-letters" in US East (N. Virginia)' in subjects
    states = {a["AlarmName"]: a["StateValue"] for a in cw.describe_alarms()["MetricAlarms"]}
    assert states["sluice-local-dead-letters"] == "ALARM"
    assert states["sluice-local-incoming-stuck"] == "OK"  # the consumer is running
    for url in dlqs:
        sqs.purge_queue(QueueUrl=url)


def test_the_dashboard_page_draws_the_stacks_metrics_in_a_browser(local, champion, tmp_path):
    """`sluice-local dashboard` writes template.yaml's dashboard as one page; headless Chromium
    draws it: every chart that has data shows its points, and the busy ones have data."""
    page = tmp_path / "dashboard.html"
    cli = [sys.executable, "-m", "sluice_local.cli", "dashboard", "--endpoint", local.endpoint]
    done = subprocess.run(
        [*cli, "--output", str(page)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(page.resolve())
    browser = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1600,3200"]
    dom = subprocess.run(
        [*browser, "--virtual-time-budget=15000", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
    ).stdout
    charts = dom.split('<div class="chart" data-points="')[1:]
    body = local.client("cloudwatch").get_dashboard(DashboardName="sluice-local")["DashboardBody"]
    assert len(charts) == sum(w["type"] == "metric" for w in json.loads(body)["widgets"])
    with_data = {}
    for chart in charts:
        title = re.search(r'class="gtitle"[^>]*>([^<]+)<', chart)
        points = int(chart.split('"', 1)[0])
        drawn = chart.count('class="point"')
        assert title, chart[:300]
        with_data[title[1]] = drawn
        if points:
            assert drawn > 0, f"{title[1]}: {points} points, none drawn"
    # what every run of this module has made by now: uploads, jobs (one failed), invocations,
    # the DLQ messages of the alarm test
    busy = (
        "Uploads in",
        "Transform jobs",
        "Errors and throttles",
        "Duration p90 (ms)",
        "Dead-letter queues (messages)",
    )
    assert all(with_data[t] > 0 for t in busy), with_data
    assert "Last retrain" in dom and "promoted" in dom


def test_the_endpoint_answers_boto3_and_the_sagemaker_sdk(local, champion):
    from sagemaker.core.resources import Endpoint, TrainingJob

    [answer] = local.users.invoke(
        [{"text": "The lazy cat eats", "parameters": {"max_new_tokens": 3}}]
    )
    assert answer["task"] == "generate" and answer["tokens"] >= 1
    session = boto3.Session(
        aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1"
    )
    os.environ["AWS_ENDPOINT_URL"] = local.endpoint  # the SDK's clients honour it, as boto3's do
    try:
        ep = Endpoint.get(local.users.endpoint, session=session)
        assert ep.endpoint_status == "InService"
        out = ep.invoke(
            body=json.dumps({"text": "Every horse likes", "task": "next_token"}),
            content_type="application/jsonlines",
            accept="application/jsonlines",
        )
        assert json.loads(out.body.read())["next_tokens"]
        job = TrainingJob.get(champion, session=session)
        assert job.training_job_status == "Completed" and job.model_artifacts.s3_model_artifacts
    finally:
        del os.environ["AWS_ENDPOINT_URL"]


def test_eventbridge_rules_deliver_to_queues_and_state_machines(local):
    """PutEvents goes through the rules in (local) EventBridge to every kind of target."""
    sfn, sqs, events = (local.client(s) for s in ("stepfunctions", "sqs", "events"))
    definition = {"StartAt": "Echo", "States": {"Echo": {"Type": "Pass", "End": True}}}
    machine = sfn.create_state_machine(
        name="echo",
        definition=json.dumps(definition),
        roleArn="arn:aws:iam::123456789012:role/echo",
    )["stateMachineArn"]
    queue = sqs.create_queue(QueueName="seen")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    pattern = {"source": ["sluice.tests"], "detail": {"n": [{"numeric": [">", 1]}]}}
    events.put_rule(Name="tests", EventPattern=json.dumps(pattern))
    events.put_targets(
        Rule="tests", Targets=[{"Id": "sfn", "Arn": machine}, {"Id": "q", "Arn": queue_arn}]
    )
    for n in (1, 2):  # only the second matches the pattern
        events.put_events(
            Entries=[{"Source": "sluice.tests", "DetailType": "t", "Detail": json.dumps({"n": n})}]
        )
    done = local.users.wait_for(
        "the execution",
        lambda: [
            e
            for e in sfn.list_executions(stateMachineArn=machine)["executions"]
            if e["status"] == "SUCCEEDED"
        ],
        60,
    )
    assert len(done) == 1
    out = json.loads(sfn.describe_execution(executionArn=done[0]["executionArn"])["output"])
    assert out["detail"] == {"n": 2} and out["source"] == "sluice.tests"
    [msg] = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=5)["Messages"]
    assert json.loads(msg["Body"])["detail"] == {"n": 2}


def test_drift_retrains_and_swaps_the_model_that_batch_then_uses(local, champion):
    users = local.users
    # new text arrives: one file is not enough to retrain by itself (RetrainMinObjects=2)...
    users.put("training/kitchen-1.txt", generate(2000, seed=7, topic="kitchen"))
    # ...and a batch of prompts like it: the drift check (asked to run now) flags it
    kitchen = [
        json.dumps(
            {"id": f"k{i}", "text": " ".join(t.split()[:4]), "parameters": {"max_new_tokens": 4}}
        )
        for i, t in enumerate(generate(150, seed=8, topic="kitchen"))
    ]
    users.put("incoming/team-b/kitchen.jsonl", kitchen)
    users.wait_for_reports(["incoming/team-b/kitchen.jsonl"])
    uploaded = time.monotonic()
    check = users.check_drift_now()
    assert check["outcome"] == "started", check
    new = users.wait_for(
        "the drift retrain's promotion",
        lambda: (lambda c: c if c != champion else None)(users.champion()),
        900,
    )
    ex = local.execution("drift-")
    out = json.loads(ex["output"])
    assert (
        out["trigger"] == "drift" and out["outcome"] == "promoted" and out["champion"] == champion
    )
    violations = json.loads(
        users.read(f"monitoring/{check['job']}/output/constraint_violations.json")
    )
    assert {v["feature_name"] for v in violations["violations"]} >= {"byte_fallback_rate"}
    # blue/green: UpdateEndpoint, and the endpoint serves the new config. One instance (the
    # default): all at once, baking under the rollback alarms (SageMaker refuses a canary larger
    # than half the variant's instances; the canary path is tests/integration/test_retrain.py's)
    endpoint = local.client("sagemaker").describe_endpoint(EndpointName=users.endpoint)
    assert endpoint["EndpointConfigName"] == new
    policy = endpoint["LastDeploymentConfig"]["BlueGreenUpdatePolicy"]
    assert policy["TrafficRoutingConfiguration"]["Type"] == "ALL_AT_ONCE"
    assert policy["TrafficRoutingConfiguration"]["WaitIntervalInSeconds"] > 0
    assert len(endpoint["LastDeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]) == 2
    assert f"Updating to {new} (ALL_AT_ONCE)" in local.events()
    # batch uses the new model (start_transform caches the SSM parameter up to 60 s, as on Lambda)
    time.sleep(max(0.0, 61 - (time.monotonic() - uploaded)))
    users.put("incoming/team-b/after.jsonl", kitchen[:3])
    [report] = users.wait_for_reports(["incoming/team-b/after.jsonl"]).values()
    assert report["status"] == "Completed" and report["model"] == new


def test_a_restart_keeps_buckets_models_and_history(local, champion):
    users = local.users
    before = {
        "objects": sorted(users.keys("")),
        "champion": users.champion(),
        "executions": _executions(local),
        "notifications": len(json.loads(_get(local.endpoint, "/_sluice/notifications"))),
    }
    assert local.stop() == 0
    local.start()
    users = local.users
    assert set(before["objects"]) <= set(users.keys(""))
    assert users.champion() == before["champion"]
    assert _executions(local) == before["executions"]
    assert (
        len(json.loads(_get(local.endpoint, "/_sluice/notifications"))) >= before["notifications"]
    )
    sm = local.client("sagemaker")
    users.wait_for(
        "the endpoint back in service",
        lambda: sm.describe_endpoint(EndpointName=users.endpoint)["EndpointStatus"] == "InService",
        180,
    )
    [answer] = users.invoke([{"text": "Heat the oven to", "parameters": {"max_new_tokens": 3}}])
    assert answer["task"] == "generate"
    history = local.client("stepfunctions").get_execution_history(
        executionArn=local.execution("drift-")["executionArn"], maxResults=1000
    )["events"]
    assert history[-1]["type"] == "ExecutionSucceeded"


def _executions(local) -> list[tuple[str, str]]:
    sfn = local.client("stepfunctions")
    arn = local.status["outputs"]["RetrainStateMachineArn"]
    return sorted(
        (e["name"], e["status"]) for e in sfn.list_executions(stateMachineArn=arn)["executions"]
    )


def _get(endpoint: str, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(endpoint + path, timeout=30) as r:
        return r.read().decode()
