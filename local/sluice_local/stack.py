"""LocalStack: template.yaml deployed and running on this machine, from one state folder.

start(): moto's backends come back from the last snapshot, the gateway serves them (and the local
SageMaker, runtime, Lambda and EventBridge answers) on one port, the template is deployed (or
re-converged), what was accepted and not finished is delivered again, and the pollers, schedules,
execution events and endpoints start. stop(): every process ends, and the state is written, so
the next start carries on where this one stopped. Without a stop (kill -9, a power cut of the
process) nothing acknowledged is lost either: see durability.py, persist.py and outbox.py.

SLUICE_LOCAL_CRASH_AT (a regular expression) kills the stack with SIGKILL when an event-log
line matches it (after SLUICE_LOCAL_CRASH_AFTER_S seconds, default 0): the crash test's failpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

from . import ACCOUNT, REGION
from .alarms import Alarms
from .deploy import Deployer, Deployment
from .events import Bus, Poller, Scheduler, Watcher, event
from .lambdas import Functions
from .outbox import Outbox
from .template import samconfig_overrides, transform

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT_EVERY_S = 10


class EventLog:
    """Every event, invocation and job as it happens: on the console and in logs/events.log."""

    def __init__(self, path: Path, out=None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the stack's life)
        self.out = out
        self.lock = threading.Lock()
        crash_at = os.environ.get("SLUICE_LOCAL_CRASH_AT")
        self.crash_at = re.compile(crash_at) if crash_at else None
        self.crash_after_s = float(os.environ.get("SLUICE_LOCAL_CRASH_AFTER_S") or 0)

    def __call__(self, category: str, message: str) -> None:
        line = f"{datetime.now():%H:%M:%S} {category:<10} {message}"
        with self.lock:
            self.file.write(line + "\n")
            self.file.flush()
            if self.out is not None:
                self.out.write(line + "\n")
                self.out.flush()
        if self.crash_at is not None and self.crash_at.search(line):
            self.crash_at = None
            threading.Timer(self.crash_after_s, _crash, (line,)).start()

    def close(self) -> None:
        self.file.close()


def _crash(line: str) -> None:
    sys.stderr.write(f"SLUICE_LOCAL_CRASH_AT matched {line!r}: kill -9\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class LocalStack:
    def __init__(
        self,
        state_dir: Path,
        port: int = 5055,
        host: str = "127.0.0.1",
        template: Path = REPO / "template.yaml",
        overrides: dict[str, str] | None = None,
        config_env: str = "local",
        out=sys.stdout,
        durability: str = "acknowledged",
        quotas: dict[str, int] | None = None,
        no_capacity: dict[str, int] | None = None,
    ):
        self.dir = Path(state_dir).resolve()
        self.host, self.port = host, port
        self.template = Path(template)
        self.overrides = {
            **samconfig_overrides(self.template.parent / "samconfig.toml", config_env),
            **(overrides or {}),
        }
        self.out = out
        self.deployment = Deployment()
        self._clients: dict[str, object] = {}
        self._closing = threading.Event()
        self.server = None
        self.durability_mode = durability
        self.durability = None  # durability.Durability once started
        self.quotas = quotas or {}  # SageMaker's account quotas (sagemaker/quotas.py)
        self.no_capacity = no_capacity or {}  # transform jobs to fail for capacity, per type

    # --- wiring ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def client(self, service: str):
        if service not in self._clients:
            import boto3
            from botocore.config import Config

            self._clients[service] = boto3.client(
                service,
                endpoint_url=self.url,
                region_name=REGION,
                aws_access_key_id="local",
                aws_secret_access_key="local",
                config=Config(retries={"max_attempts": 2}, read_timeout=120),
            )
        return self._clients[service]

    def start(self) -> LocalStack:
        from moto.core.config import default_user_config
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        from . import moto_fixes, persist, processes, validation
        from .durability import Durability
        from .gateway import Gateway
        from .sagemaker import jobs
        from .sagemaker.api import LocalSageMaker
        from .sagemaker.endpoints import EndpointRunner
        from .sagemaker.runtime import Context
        from .sagemaker.tuning import TuningRunner

        self.dir.mkdir(parents=True, exist_ok=True)
        for noisy in ("botocore", "boto3", "urllib3", "werkzeug"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        # moto's interpreter logs every optional JSONPath it finds absent as an ERROR: what goes
        # wrong in an execution is in its history (and the event log), not there
        logging.getLogger("moto").setLevel(logging.CRITICAL)
        self.say = EventLog(self.dir / "logs" / "events.log", self.out)
        # containers a previous stack left running when it died (kill -9): killed before anything
        killed = processes.use(self.dir / "processes.json")
        if killed:
            self.say("stack", f"reaped {len(killed)} process(es) a previous stack left running")
        # as strict as AWS: every request this process sends (the functions, the state
        # machine's tasks, the deployer) is checked against the service's own rules first
        self._strict = validation.strict_clients(
            lambda v: self.say("aws", f"{v[0]} {v[1]} refused: {'; '.join(v[2])}")
        )
        self._strict.__enter__()
        default_user_config["stepfunctions"]["execute_state_machine"] = True
        moto_fixes.apply()
        aborted = persist.restore(self.dir / "moto")
        self.durability = Durability(
            self.dir / "moto",
            self.say,
            SNAPSHOT_EVERY_S,
            acknowledged=self.durability_mode == "acknowledged",
        )
        self.durability.start()
        self.outbox = Outbox(self.dir / "outbox")

        class Quiet(MotoRequestHandler):
            def log_request(self, *args) -> None:  # the event log says what matters
                return None

        app = Gateway(self, DomainDispatcherApplication(create_backend_app))
        self.server = make_server(self.host, self.port, app, threaded=True, request_handler=Quiet)
        self.port = self.server.server_address[1]
        # what the SDKs in this process (the functions, Step Functions' tasks) talk to
        os.environ.update(
            AWS_ENDPOINT_URL=self.url,
            MOTO_PORT=str(self.port),
            AWS_ACCESS_KEY_ID="local",
            AWS_SECRET_ACCESS_KEY="local",
            AWS_DEFAULT_REGION=REGION,
            AWS_REGION=REGION,
        )
        os.environ.pop("AWS_PROFILE", None)
        self.base_env = dict(os.environ)
        threading.Thread(target=self.server.serve_forever, daemon=True, name="gateway").start()

        self.functions = Functions(
            {}, self.base_env, self.dir / "logs" / "functions", self.say, self.client, self.outbox
        )
        self.bus = Bus(self.client, self.functions, self.say, self.outbox)
        self.sagemaker = LocalSageMaker(
            self.dir / "sagemaker", self._sagemaker_event, self.quotas, self.no_capacity
        )
        ctx = Context(self.dir / "sagemaker", self.url, self.base_env, self.say)
        self.jobs = [
            jobs.TrainingRunner(self.sagemaker, ctx),
            jobs.TransformRunner(self.sagemaker, ctx),
            jobs.ProcessingRunner(self.sagemaker, ctx),
            jobs.CompilationRunner(self.sagemaker, ctx),
            TuningRunner(self.sagemaker, ctx),
        ]
        for runner in self.jobs:
            self.sagemaker.runners[runner.kind] = runner
        self.endpoints = EndpointRunner(self.sagemaker, ctx, self._alarm_states)
        self.sagemaker.runners["Endpoint"] = self.endpoints

        self.deploy()
        # from here on, a change is answered only once it is on disk
        self.durability.enable()
        self.pollers = [
            Poller(s, self.client, self.functions, self.say)
            for s in self.deployment.event_sources
            if s.enabled
        ]
        self.scheduler = Scheduler(self.client, self.functions, self.say)
        self.watcher = Watcher(self.client, self.bus, self.say)
        self.alarms = Alarms(self.client, self.say)
        # what the last stop interrupted: executions cannot resume (their ABORTED event goes
        # out, so the failure rule reports them); jobs and endpoints carry on
        for arn in aborted:
            self.watcher.publish(arn)
        for job in jobs.resume(self.jobs):
            self.say("job", f"{job} was running when the stack stopped: running it again")
        self.endpoints.restore()
        self.redeliver()
        self.banner()
        return self

    def deploy(self) -> Deployment:
        previous_file = self.dir / "deployment.json"
        previous = json.loads(previous_file.read_text()) if previous_file.exists() else None
        t = transform(self.template, self.overrides)
        stage = str(t.parameters.get("Stage", "local"))
        self.stage = stage
        deployer = Deployer(t, self.client, f"sluice-{stage}", previous)
        self.deployment = deployer.deploy()
        deployer.register_stack()
        self.functions.specs.update(self.deployment.functions)
        previous_file.write_text(json.dumps(self.deployment.to_json(), indent=1, default=str))
        return self.deployment

    def _sagemaker_event(self, detail_type: str, detail: dict) -> None:
        self.bus.put(event("aws.sagemaker", detail_type, detail))

    def _alarm_states(self, names: list[str]) -> dict[str, str]:
        alarms = self.client("cloudwatch").describe_alarms(AlarmNames=names)["MetricAlarms"]
        return {a["AlarmName"]: a["StateValue"] for a in alarms}

    def redeliver(self) -> None:
        """What the last run accepted and had not finished (it crashed): done now."""
        pending = self.outbox.pending()
        for oid, item in pending:
            if item["kind"] == "event":
                self.bus.requeue(oid, item["event"])
            elif item["kind"] == "invoke":
                self.functions.requeue(oid, item)
        published = self.sagemaker.publish_pending()
        if pending or published:
            self.say(
                "stack",
                f"delivering again what the last run accepted and did not finish: "
                f"{len(pending)} event(s) and invocation(s), "
                f"{len(published)} status change(s) ({', '.join(published) or 'none'})",
            )

    # --- what the gateway and the CLI show ------------------------------------------------------

    def notify(self, topic: str, subject: str, message: str) -> None:
        with open(self.dir / "logs" / "notifications.jsonl", "a", encoding="utf-8") as f:
            f.write(
                json.dumps(
                    {"time": time.time(), "topic": topic, "subject": subject, "message": message}
                )
                + "\n"
            )
        self.say("sns", f"{topic}: {subject or message[:100]}")

    def dashboard_html(self, hours: float = 3.0) -> str:
        """The stack's CloudWatch dashboard drawn from its own metrics (dashboard.py)."""
        from .dashboard import render

        return render(self.client, self.stage, self.deployment.outputs["DataBucketName"], hours)

    def notifications(self) -> list[dict]:
        path = self.dir / "logs" / "notifications.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def function_configurations(self) -> list[dict]:
        return [
            {
                "FunctionName": s.name,
                "FunctionArn": s.arn,
                "Runtime": "python3.11",
                "Handler": s.handler,
                "Timeout": s.timeout_s,
                "MemorySize": s.memory_mb,
                "Environment": {"Variables": s.environment},
            }
            for s in self.functions.specs.values()
        ]

    def status(self) -> dict:
        return {
            "endpoint": self.url,
            "state": str(self.dir),
            "account": ACCOUNT,
            "region": REGION,
            "outputs": self.deployment.outputs,
            "functions": sorted(self.functions.specs),
            "eventSources": [
                {
                    "queue": s.queue_arn.rsplit(":", 1)[1],
                    "function": s.function,
                    "batchSize": s.batch_size,
                    "windowSeconds": s.window_s,
                }
                for s in self.deployment.event_sources
            ],
            "schedules": [s["Name"] for s in self.scheduler.schedules()],
            "notCreated": self.deployment.skipped,
        }

    def banner(self) -> None:
        o = self.deployment.outputs
        lines = [
            f"Sluice is running locally: {self.template.name}, stage {self.stage}, "
            f"state in {self.dir}",
            f"  endpoint     {self.url}",
            f"  credentials  export AWS_ENDPOINT_URL={self.url} AWS_ACCESS_KEY_ID=local "
            f"AWS_SECRET_ACCESS_KEY=local AWS_DEFAULT_REGION={REGION}",
        ]
        if "DataBucketName" in o:
            lines += [
                f"  data bucket  s3://{o['DataBucketName']}/  (prompts under incoming/, "
                "training text under training/)"
            ]
        lines += [
            f"  functions    {', '.join(sorted(self.functions.specs))}",
            f"  schedules    {', '.join(s['Name'] for s in self.scheduler.schedules())} "
            "(on demand: sluice-local schedule NAME)",
        ]
        by_reason: dict[tuple[str, str], list[str]] = {}
        for s in self.deployment.skipped:
            by_reason.setdefault((s["type"], s["why"]), []).append(s["id"])
        for (kind, why), ids in by_reason.items():
            lines.append(f"  not created  {len(ids)} {kind} ({', '.join(ids)}): {why}")
        for line in lines:
            self.say("stack", line)

    # --- stopping -------------------------------------------------------------------------------

    def stop(self) -> None:
        from .sagemaker.jobs import wait_idle

        self._closing.set()
        self.say("stack", "stopping: ending jobs and endpoints, writing the state")
        for p in self.pollers:
            p.close()
        self.scheduler.close()
        self.watcher.close()
        self.alarms.close()
        self.bus.drain(10)
        self.bus.close()
        self.functions.close()
        # jobs keep their InProgress record: the next start reports them interrupted (Failed)
        for runner in self.jobs:
            runner.shutdown()
        wait_idle(self.jobs, 30)
        self.endpoints.shutdown()
        self.durability.close()
        self.sagemaker.save()
        self.server.shutdown()
        self.server.server_close()
        self._strict.__exit__(None, None, None)
        self.say("stack", f"stopped; `sluice-local up --state {self.dir}` carries on from here")
        self.say.close()

    def wait_forever(self) -> None:
        """Until Ctrl-C or SIGTERM. In short sleeps: a signal the kernel hands to another thread
        only sets Python's flag, which the main thread reads when it wakes (a stack asleep
        for an hour ignored a SIGINT that way)."""
        try:
            while True:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
