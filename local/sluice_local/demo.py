"""`sluice-local demo`: the whole event flow from nothing, on this machine.

It starts local Sluice (template.yaml on local AWS APIs), then acts as its users would, with
boto3 against the local endpoint: training text lands under training/ and the retraining state
machine trains, gates and promotes a first model; prompt files land under incoming/ and come
back as predictions beside a _SUCCESS.json; the endpoint answers; then a new kind of text shows
up, the drift check flags it, a retrain starts by itself and the endpoint is swapped blue/green.
The stack's own log (every event, invocation and job) runs alongside, indented.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from sluice_functions.aws import NO_MODEL

from .corpus import generate, sample_files
from .quickstart import show_line
from .stack import LocalStack
from .template import parse_overrides, samconfig_overrides


class DemoFailed(Exception):
    pass


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def say(text: str) -> None:
    print(f"    {text}", flush=True)


def wait_for(what: str, check, timeout_s: float, logs: Path):
    """Poll `check` until it returns something; DemoFailed (with where to look) on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(2)
    raise DemoFailed(f"{what} did not happen within {timeout_s:.0f} s; see {logs}/")


class Users:
    """What the data team does, with boto3 against a local Sluice (the demo's, a test's)."""

    def __init__(self, client, outputs: dict, logs: Path):
        self.client, self.outputs, self.logs = client, outputs, logs
        self.bucket = outputs["DataBucketName"]
        self.parameter = outputs["CurrentModelParameterName"]
        self.endpoint = outputs["EndpointName"]
        self.s3 = client("s3")

    def wait_for(self, what: str, check, timeout_s: float = 600):
        return wait_for(what, check, timeout_s, self.logs)

    def put(self, key: str, lines: list[str]) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=("\n".join(lines) + "\n").encode())

    def read(self, key: str) -> str:
        return self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()

    def keys(self, prefix: str) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def use_model(self, model_dir: Path, name: str, image: str = "sluice:local") -> str:
        """A model trained elsewhere, as docs/batch.md tells users to bring one: its folder as
        model.tar.gz in the data bucket, a SageMaker Model, and the parameter batch reads."""
        from .sagemaker.runtime import tar_dir

        key = f"models/{name}/model.tar.gz"
        with tempfile.TemporaryDirectory() as tmp:
            archive = tar_dir(Path(model_dir), Path(tmp) / "model.tar.gz")
            self.s3.upload_file(str(archive), self.bucket, key)
        self.client("sagemaker").create_model(
            ModelName=name,
            ExecutionRoleArn=self.outputs["SageMakerExecutionRoleArn"],
            PrimaryContainer={"Image": image, "ModelDataUrl": f"s3://{self.bucket}/{key}"},
        )
        self.client("ssm").put_parameter(
            Name=self.parameter, Value=name, Type="String", Overwrite=True
        )
        return name

    def champion(self) -> str:
        value = self.client("ssm").get_parameter(Name=self.parameter)["Parameter"]["Value"]
        return "" if value in NO_MODEL else value

    def wait_for_reports(self, inputs: list[str]) -> dict[str, dict]:
        """The _SUCCESS.json / _FAILURE.json reports that cover these uploads, by report key."""
        wanted = {f"s3://{self.bucket}/{k}" for k in inputs}

        def covering() -> dict[str, dict] | None:
            found = {}
            for key in self.keys("outputs/"):
                if key.endswith(("_SUCCESS.json", "_FAILURE.json")):
                    doc = json.loads(self.read(key))
                    if wanted & set(doc.get("inputs", [])):
                        found[key] = doc
            covered = {i for doc in found.values() for i in doc.get("inputs", [])}
            return found if wanted <= covered else None

        return self.wait_for(f"the reports of {', '.join(inputs)}", covering)

    def finished_execution(self, name_prefix: str = "", timeout_s: float = 300) -> dict:
        """The newest retrain execution (named so), once it has ended: batch moves to a new
        model (the SSM parameter) a few states before the execution reports and ends."""
        sfn = self.client("stepfunctions")
        arn = self.outputs["RetrainStateMachineArn"]

        def ended() -> dict | None:
            found = [
                e
                for e in sfn.list_executions(stateMachineArn=arn)["executions"]
                if e["name"].startswith(name_prefix)
            ]
            if not found or found[0]["status"] == "RUNNING":
                return None
            return sfn.describe_execution(executionArn=found[0]["executionArn"])

        return self.wait_for(f"the end of execution {name_prefix}*", ended, timeout_s)

    def check_drift_now(self) -> dict:
        """What an operator does rather than wait for the hourly check."""
        out = self.client("lambda").invoke(
            FunctionName=self.outputs["StartMonitorFunctionName"], Payload=b'{"end": "now"}'
        )
        return json.loads(out["Payload"].read())

    def invoke(self, records: list[dict]) -> list[dict]:
        body = "\n".join(json.dumps(r) for r in records)
        out = (
            self.client("sagemaker-runtime")
            .invoke_endpoint(
                EndpointName=self.endpoint,
                Body=body.encode(),
                ContentType="application/jsonlines",
                Accept="application/jsonlines",
            )["Body"]
            .read()
            .decode()
        )
        return [json.loads(line) for line in out.splitlines()]


def overrides(args) -> dict[str, str]:
    """samconfig.toml's local values, the demo's step count, then the command line's."""
    from .stack import REPO

    values = samconfig_overrides(
        (args.template or REPO / "template.yaml").parent / "samconfig.toml", args.config_env
    )
    hp = json.loads(values.get("TrainingHyperparameters") or "{}")
    hp["max_steps"] = str(args.steps)
    return {
        **values,
        "TrainingHyperparameters": json.dumps(hp),
        **parse_overrides(args.parameter_overrides),
    }


def run_demo(args) -> int:
    from .stack import REPO

    state = Path(args.state)
    if state.exists() and not args.keep:
        shutil.rmtree(state)
    stack = LocalStack(
        state,
        port=args.port,
        host=args.host,
        template=args.template or REPO / "template.yaml",
        overrides=overrides(args),
        config_env=args.config_env,
        out=_Indented(sys.stdout),
    )
    step(
        "Starting local Sluice: template.yaml on local AWS APIs, a local SageMaker, the Lambda "
        "handlers in-process"
    )
    stack.start()
    t0 = time.monotonic()
    try:
        story(
            Users(stack.client, stack.deployment.outputs, stack.dir / "logs"), stack.notifications
        )
        page = state.parent / "dashboard.html"
        page.write_text(stack.dashboard_html(hours=1))
        step(f"The dashboard sluice-{stack.stage}, drawn from this run's metrics: {page.resolve()}")
    except DemoFailed as e:
        print(f"\ndemo failed: {e}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
    print(
        f"\nDone in {time.monotonic() - t0:.0f} s. Everything is kept in {state}/: "
        f"`sluice-local up --state {state}` starts it again where it stopped."
    )
    return 0


def story(users: Users, notifications) -> None:
    step(f"1/5 Training text lands in s3://{users.bucket}/training/ (2 files, animal facts)")
    for i in (1, 2):
        users.put(f"training/animals-{i}.txt", generate(2000, seed=i))
    say(
        "the retrain trigger starts the state machine; it trains a tiny GPT-2 (a minute or so), "
        "gates it, registers it, creates the endpoint and points batch inference at it"
    )
    champion = users.wait_for("the first model's promotion", users.champion, 1200)
    out = json.loads(users.finished_execution()["output"])
    say(f"promoted {champion}: {out['decision']['why']}")

    step(f"2/5 Users drop prompt files into s3://{users.bucket}/incoming/")
    for name, lines in sample_files().items():
        users.put(f"incoming/team-a/{name}", lines)
    reports = users.wait_for_reports(
        ["incoming/team-a/prompts.jsonl", "incoming/team-a/mixed.jsonl"]
    )
    for key, report in reports.items():
        say(
            f"{key}: {report['status']}, {report['records']} lines, "
            f"{report['error_lines']} error line(s), model {report.get('model')}"
        )
        for f in report.get("outputs", []):
            src = f["input"].split(f"s3://{users.bucket}/", 1)[1]
            out_key = f["output"].split(f"s3://{users.bucket}/", 1)[1]
            say(f"{src} -> {out_key}")
            for line_in, line_out in zip(
                users.read(src).splitlines(), users.read(out_key).splitlines(), strict=True
            ):
                say(f"  {show_line(line_in, line_out)}")

    step(f"3/5 The real-time endpoint {users.endpoint} answers the same way (sagemaker-runtime)")
    for r in users.invoke(
        [{"text": "When Emma feeds the horse, it gets", "parameters": {"max_new_tokens": 6}}]
    ):
        say(f"'When Emma feeds the horse, it gets' -> ...{r['generated_text']}")

    step(
        "4/5 Something new: kitchen text. A first file of it lands under training/ (one file: "
        "not yet enough to retrain), and a batch of kitchen prompts comes in"
    )
    users.put("training/kitchen-1.txt", generate(3000, seed=7, topic="kitchen"))
    kitchen = [
        {"id": f"k{i}", "text": " ".join(t.split()[:4]), "parameters": {"max_new_tokens": 8}}
        for i, t in enumerate(generate(150, seed=8, topic="kitchen"))
    ]
    shown = list({k["text"]: k for k in kitchen}.values())[:3]  # three different prompts
    users.put("incoming/team-b/kitchen.jsonl", [json.dumps(k) for k in kitchen])
    [report] = users.wait_for_reports(["incoming/team-b/kitchen.jsonl"]).values()
    out_key = report["outputs"][0]["output"].split(f"s3://{users.bucket}/", 1)[1]
    before = {
        row["id"]: row.get("generated_text", "")
        for row in map(json.loads, users.read(out_key).splitlines())
    }
    say("the drift check runs each hour; asking it to check now (as an operator can):")
    result = users.check_drift_now()
    say(f"start-monitor: {result}")
    job = result.get("job")
    violations_key = f"monitoring/{job}/output/constraint_violations.json"
    users.wait_for("the drift report", lambda: violations_key in users.keys(f"monitoring/{job}/"))
    found = json.loads(users.read(violations_key))["violations"]
    for v in found:
        say(f"  drift: {v['feature_name']}: {v['description']}")
    say(
        "drift -> the retrain trigger starts a retrain (on animals + kitchen text), the gate "
        "compares it with the champion on the same held-out text, the endpoint swaps blue/green"
    )
    new = users.wait_for(
        "the retrained model's promotion",
        lambda: (lambda c: c if c and c != champion else None)(users.champion()),
        1200,
    )
    out = json.loads(users.finished_execution()["output"])
    say(f"promoted {new} (trigger: {out.get('trigger')}): {out['decision']['why']}")

    step("5/5 The same kitchen prompts, before and after the swap")
    after = {r["id"]: r.get("generated_text", "") for r in users.invoke(shown)}
    for k in shown:
        say(f"{k['text']!r:38} old: ...{before.get(k['id'], '')!r:32} new: ...{after[k['id']]!r}")
    notes = notifications()
    say(
        f"{len(notes)} notification(s) went to the topic: "
        + "; ".join(sorted({n["subject"] or n["topic"] for n in notes}))
    )


class _Indented:
    """The stack's log, indented under the demo's story (and without its S3 chatter)."""

    def __init__(self, out):
        self.out = out

    def write(self, text: str) -> int:
        for line in text.splitlines(keepends=True):
            if " s3 " not in line[:20]:
                self.out.write(("      | " + line) if line.strip() else line)
        return len(text)

    def flush(self) -> None:
        self.out.flush()
