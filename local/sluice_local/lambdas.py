"""The template's Lambda functions, run in this process the way Lambda runs them.

Each function's handler is imported on its first invocation (a cold start) with its own
environment: the template's variables plus what Lambda sets (AWS_LAMBDA_FUNCTION_NAME, ...); the
only difference from AWS is the endpoint variables pointing at the local stack. Invocations are
one at a time (the environment is the process's), each with a context object, its output
captured to the function's log file, and its Powertools metrics (EMF lines) put to CloudWatch as
CloudWatch Logs would. Asynchronous invocations (EventBridge rules, schedules, InvocationType
Event) are retried twice on error, then sent to the function's dead-letter queue, as Lambda does.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import queue
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path

from . import REGION
from .deploy import FunctionSpec, send_to
from .outbox import Outbox

ASYNC_RETRY_DELAYS_S = (5, 10)  # Lambda retries async errors twice (after ~1 and ~2 minutes)


class Context:
    """The context object a handler receives."""

    def __init__(self, spec: FunctionSpec):
        self.function_name = spec.name
        self.function_version = "$LATEST"
        self.invoked_function_arn = spec.arn
        self.memory_limit_in_mb = str(spec.memory_mb)
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{spec.name}"
        self.log_stream_name = time.strftime("%Y/%m/%d/[$LATEST]") + uuid.uuid4().hex
        self.identity = self.client_context = None
        self._deadline = time.monotonic() + spec.timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


class _Output(io.TextIOBase):
    """sys.stdout (and stderr) for the whole process: an invocation's thread writes to its own
    capture, so the function's log holds what it printed, logged and warned."""

    def __init__(self, real):
        self.real = real
        self.local = threading.local()

    def write(self, text: str) -> int:
        sink = getattr(self.local, "sink", None)
        (sink if sink is not None else self.real).write(text)
        return len(text)

    def flush(self) -> None:
        self.real.flush()

    def isatty(self) -> bool:
        return False


@dataclass
class Result:
    payload: object
    error: dict | None
    duration_ms: float
    cold: bool


class Functions:
    def __init__(
        self,
        specs: dict[str, FunctionSpec],
        base_env: dict[str, str],
        log_dir: Path,
        say,
        client,
        outbox: Outbox | None = None,
    ):
        self.specs = specs
        self.base_env = base_env
        self.log_dir = log_dir
        self.say = say
        self.client = client  # (service) -> boto3 client on the local endpoint
        self.outbox = outbox  # asynchronous invocations on disk until they are done
        self.handlers: dict[str, object] = {}
        self.busy: dict[str, int] = {}  # invocations in flight per function (event sources')
        self.busy_lock = threading.Lock()
        self.providers: dict[str, dict] = {}  # each function's Powertools Parameters providers
        self.lock = threading.Lock()
        self.queue: queue.Queue = queue.Queue()
        self.closed = threading.Event()
        if not isinstance(sys.stdout, _Output):
            sys.stdout = _Output(sys.stdout)
        if not isinstance(sys.stderr, _Output):
            sys.stderr = _Output(sys.stderr)
        self.streams: tuple[_Output, _Output] = (sys.stdout, sys.stderr)  # type: ignore[assignment]
        self.worker = threading.Thread(target=self._async_loop, daemon=True, name="lambda-async")
        self.worker.start()

    def spec(self, name_or_arn: str) -> FunctionSpec:
        name = name_or_arn.split(":function:")[-1].split(":")[0]
        if name not in self.specs:
            raise KeyError(f"Function not found: {name_or_arn}")
        return self.specs[name]

    def lambda_env(self, spec: FunctionSpec) -> dict[str, str]:
        return {
            **self.base_env,
            "AWS_LAMBDA_FUNCTION_NAME": spec.name,
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(spec.memory_mb),
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{spec.name}",
            "AWS_EXECUTION_ENV": "AWS_Lambda_python3.11",
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "LAMBDA_TASK_ROOT": str(spec.code_dir),
            "_HANDLER": spec.handler,
            **spec.environment,
        }

    # --- concurrency ----------------------------------------------------------------------------

    def reserve(self, name: str) -> bool:
        """Take a unit of the function's concurrency: False (throttled) when it already runs
        its ReservedConcurrentExecutions."""
        spec = self.spec(name)
        with self.busy_lock:
            busy = self.busy.get(spec.name, 0)
            if spec.reserved_concurrency is not None and busy >= spec.reserved_concurrency:
                return False
            self.busy[spec.name] = busy + 1
            return True

    def release(self, name: str) -> None:
        spec = self.spec(name)
        with self.busy_lock:
            self.busy[spec.name] = max(0, self.busy.get(spec.name, 0) - 1)

    def throttled(self, name: str, source: str) -> None:
        """A throttled invocation: logged and counted (AWS/Lambda Throttles), not run."""
        spec = self.spec(name)
        self.say(
            "lambda",
            f"{spec.name} <- {source}: throttled (TooManyRequestsException: reserved "
            f"concurrency {spec.reserved_concurrency} in use)",
        )
        self._lambda_metrics(spec, [("Throttles", 1, "Count")])

    # --- synchronous invocation -----------------------------------------------------------------

    def invoke(self, name: str, event: object, source: str = "") -> Result:
        """Invoke and wait, as InvocationType RequestResponse (and event source mappings) do."""
        spec = self.spec(name)
        context = Context(spec)
        captured = io.StringIO()
        with self.lock:
            saved = dict(os.environ)
            os.environ.update(self.lambda_env(spec))
            for stream in self.streams:
                stream.local.sink = captured
            t0 = time.perf_counter()
            cold = spec.name not in self.handlers
            try:
                handler = self._handler(spec)
                with self._own_process_state(spec.name):
                    payload, error = handler(event, context), None
            except Exception as e:
                traceback.print_exc(file=captured)
                payload, error = (
                    None,
                    {
                        "errorMessage": str(e),
                        "errorType": type(e).__name__,
                        "stackTrace": traceback.format_tb(e.__traceback__),
                    },
                )
            finally:
                duration = (time.perf_counter() - t0) * 1000
                for stream in self.streams:
                    stream.local.sink = None
                for k in set(os.environ) - set(saved):
                    del os.environ[k]
                os.environ.update(saved)
        self._record(spec, context, captured.getvalue(), duration)
        self._lambda_metrics(
            spec,
            [
                ("Invocations", 1, "Count"),
                ("Errors", int(error is not None), "Count"),
                ("Throttles", 0, "Count"),
                ("Duration", duration, "Milliseconds"),
                ("ConcurrentExecutions", 1, "Count"),
            ],
        )
        if duration > spec.timeout_s * 1000:
            self.say(
                "lambda",
                f"{spec.name}: ran {duration / 1000:.1f} s, past its "
                f"{spec.timeout_s} s timeout (Lambda would have stopped it)",
            )
        outcome = (
            f"error {error['errorType']}: {error['errorMessage']}" if error else _brief(payload)
        )
        self.say(
            "lambda",
            f"{spec.name} <- {source or 'invoke'}{' (cold start)' if cold else ''}"
            f" -> {outcome} ({duration:.0f} ms)",
        )
        return Result(payload, error, duration, cold)

    @contextlib.contextmanager
    def _own_process_state(self, name: str):
        """On Lambda each function has its own process, so its own Powertools Parameters cache.
        Here the functions share one interpreter: each gets its own cache for its invocation,
        so one function's cached value never reaches another."""
        from aws_lambda_powertools.utilities.parameters.constants import DEFAULT_PROVIDERS

        outside = dict(DEFAULT_PROVIDERS)
        DEFAULT_PROVIDERS.clear()
        DEFAULT_PROVIDERS.update(self.providers.setdefault(name, {}))
        try:
            yield
        finally:
            self.providers[name] = dict(DEFAULT_PROVIDERS)
            DEFAULT_PROVIDERS.clear()
            DEFAULT_PROVIDERS.update(outside)

    def _handler(self, spec: FunctionSpec):
        if spec.name not in self.handlers:
            if str(spec.code_dir) not in sys.path:
                sys.path.insert(0, str(spec.code_dir))
            module, _, attr = spec.handler.rpartition(".")
            self.handlers[spec.name] = getattr(importlib.import_module(module), attr)
        return self.handlers[spec.name]

    def _record(self, spec: FunctionSpec, context: Context, output: str, duration: float) -> None:
        """The function's log (as CloudWatch Logs keeps it); EMF lines become metrics."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{spec.name}.log", "a", encoding="utf-8") as f:
            f.write(f"START RequestId: {context.aws_request_id} Version: $LATEST\n{output}")
            f.write(
                f"END RequestId: {context.aws_request_id}\nREPORT RequestId: "
                f"{context.aws_request_id}\tDuration: {duration:.2f} ms\n"
            )
        for line in output.splitlines():
            if line.startswith("{") and '"_aws"' in line:
                try:
                    put_emf(self.client("cloudwatch"), json.loads(line))
                except Exception as e:  # a metric must never fail the invocation
                    self.say("lambda", f"{spec.name}: metric not recorded: {e}")

    def _lambda_metrics(self, spec: FunctionSpec, rows: list[tuple[str, float, str]]) -> None:
        """What Lambda publishes (AWS/Lambda, FunctionName): (metric, value, unit) rows."""
        dims = [{"Name": "FunctionName", "Value": spec.name}]
        data = [
            {"MetricName": name, "Dimensions": dims, "Value": value, "Unit": unit}
            for name, value, unit in rows
        ]
        try:
            self.client("cloudwatch").put_metric_data(Namespace="AWS/Lambda", MetricData=data)
        except Exception as e:  # a metric must never fail an invocation or stop a poller
            self.say("lambda", f"{spec.name}: metric not recorded: {e}")

    # --- asynchronous invocation ----------------------------------------------------------------

    def invoke_async(self, name: str, event: object, source: str = "") -> None:
        """InvocationType Event: queued (on disk, with an outbox), retried twice on error, then
        the dead-letter queue."""
        self.spec(name)  # unknown functions fail at once, as Lambda's Invoke does
        item = {"kind": "invoke", "function": name, "event": event, "source": source}
        oid = self.outbox.add(item) if self.outbox else None
        self.queue.put((name, event, source, 0, 0.0, oid))

    def requeue(self, oid: str, item: dict) -> None:
        """An invocation accepted before a crash and not finished: run now."""
        self.queue.put((item["function"], item["event"], item["source"], 0, 0.0, oid))

    def _async_loop(self) -> None:
        while not self.closed.is_set():
            try:
                name, event, source, attempt, not_before, oid = self.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if time.monotonic() < not_before:
                self.queue.put((name, event, source, attempt, not_before, oid))
                time.sleep(0.05)
                continue
            result = self.invoke(name, event, source)
            if result.error is not None and attempt < len(ASYNC_RETRY_DELAYS_S):
                delay = ASYNC_RETRY_DELAYS_S[attempt]
                self.queue.put((name, event, source, attempt + 1, time.monotonic() + delay, oid))
                continue
            if result.error is not None:
                spec = self.spec(name)
                if spec.dead_letter_arn:
                    self._dead_letter(spec, event, result.error)
                else:
                    self.say("lambda", f"{spec.name}: event dropped after 3 attempts (no DLQ)")
            if self.outbox is not None:
                self.outbox.done(oid)

    def _dead_letter(self, spec: FunctionSpec, event: object, error: dict) -> None:
        """Lambda's dead-letter message: the event, and why it failed in attributes (SQS)."""
        why = {"ErrorMessage": {"DataType": "String", "StringValue": error["errorMessage"][:256]}}
        attributes = {"MessageAttributes": why} if ":sqs:" in spec.dead_letter_arn else {}
        send_to(self.client, spec.dead_letter_arn, json.dumps(event), **attributes)
        name = spec.dead_letter_arn.rsplit(":", 1)[1]
        self.say("lambda", f"{spec.name}: event sent to its dead-letter queue {name}")

    def close(self) -> None:
        self.closed.set()


def put_emf(cloudwatch, doc: dict) -> None:
    """One Embedded Metric Format document as PutMetricData (what CloudWatch Logs extracts)."""
    meta = doc["_aws"]
    stamp = meta.get("Timestamp", time.time() * 1000) / 1000
    for directive in meta.get("CloudWatchMetrics", []):
        dims_sets = directive.get("Dimensions") or [[]]
        data = []
        for metric in directive.get("Metrics", []):
            value = doc.get(metric["Name"])
            values = value if isinstance(value, list) else [value]
            for dims in dims_sets:
                for v in values:
                    if v is None:
                        continue
                    data.append(
                        {
                            "MetricName": metric["Name"],
                            "Value": float(v),
                            "Unit": metric.get("Unit", "None"),
                            "Timestamp": stamp,
                            "Dimensions": [
                                {"Name": d, "Value": str(doc[d])} for d in dims if d in doc
                            ],
                        }
                    )
        for i in range(0, len(data), 20):
            cloudwatch.put_metric_data(
                Namespace=directive["Namespace"], MetricData=data[i : i + 20]
            )


def _brief(payload: object) -> str:
    text = json.dumps(payload, default=str)
    return text if len(text) <= 160 else text[:157] + "..."
