"""Real-time endpoints: each production variant is a real `sluice serve` process.

CreateEndpoint starts the config's variants and goes InService once they pass /ping.
UpdateEndpoint deploys blue/green as SageMaker does: the new (green) fleet starts beside the old,
a canary share of requests goes to it for the bake time, then all of it, while the
AutoRollbackConfiguration alarms are watched; an alarm in ALARM (or a fleet that never passes
/ping) rolls back to the old config, which keeps serving. InvokeEndpoint (sagemaker-runtime)
reaches the variants through the gateway, and data capture writes SageMaker's capture files.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sluice.errors import SluiceError

from ..transform import ServeProcess
from .api import LocalSageMaker
from .runtime import Context, now, primary_container, split_s3
from .shapes import ApiError

PING_TIMEOUT_S = 240  # SageMaker: a container must pass /ping within 4 minutes
INVOKE_TIMEOUT_S = 60  # real-time invocations must answer within 60 s


@dataclass
class Fleet:
    """One endpoint config's variants, serving."""

    config: str
    variants: dict[str, ServeProcess]  # variant name -> process
    weights: dict[str, float]
    capture: dict | None = None  # the config's DataCaptureConfig, when enabled

    def pick(self, target: str | None) -> tuple[str, ServeProcess]:
        if target:
            if target not in self.variants:
                raise ApiError("ValidationError", f"variant {target} is not in {self.config}")
            return target, self.variants[target]
        names = list(self.variants)
        name = random.choices(names, [self.weights[n] for n in names])[0]
        return name, self.variants[name]

    def stop(self) -> None:
        for p in self.variants.values():
            p.stop()


@dataclass
class Live:
    """What an endpoint serves now: its fleet, and during a canary the share going to green."""

    fleet: Fleet
    green: Fleet | None = None
    green_share: float = 0.0
    captured: list[str] = field(default_factory=list)  # capture lines not yet written


class EndpointRunner:
    def __init__(self, api: LocalSageMaker, ctx: Context, alarm_states):
        self.api, self.ctx = api, ctx
        self.alarm_states = alarm_states  # [alarm names] -> {name: StateValue}
        self.live: dict[str, Live] = {}
        self.lock = threading.Lock()
        self.closed = threading.Event()
        threading.Thread(target=self._flush_loop, daemon=True, name="capture").start()

    # --- fleets ---------------------------------------------------------------------------------

    def _fleet(self, endpoint: str, config_name: str) -> Fleet:
        """Start every variant of a config and wait for /ping; SluiceError if one never passes."""
        config = self.api.get("EndpointConfig", config_name)
        started: dict[str, ServeProcess] = {}
        try:
            for v in config["ProductionVariants"]:
                container = primary_container(self.api.get("Model", v["ModelName"]))
                model_dir = self.ctx.model_dir(container["ModelDataUrl"])
                log = (
                    self.ctx.root / "endpoints" / endpoint / f"{config_name}-{v['VariantName']}.log"
                )
                log.parent.mkdir(parents=True, exist_ok=True)
                env = container.get("Environment") or {}
                started[v["VariantName"]] = ServeProcess(model_dir, env, log, self.ctx.env())
            for p in started.values():
                p.wait_ready(PING_TIMEOUT_S)
        except (SluiceError, ApiError, OSError) as e:
            for p in started.values():
                p.stop()
            raise SluiceError(f"{config_name}: {e}") from e
        capture = config.get("DataCaptureConfig") or {}
        return Fleet(
            config_name,
            started,
            {
                v["VariantName"]: float(v.get("InitialVariantWeight", 1.0))
                for v in config["ProductionVariants"]
            },
            capture if capture.get("EnableCapture") else None,
        )

    def _variants(self, config_name: str, status: str = "InService") -> list[dict]:
        config = self.api.get("EndpointConfig", config_name)
        return [
            {
                "VariantName": v["VariantName"],
                "CurrentWeight": v.get("InitialVariantWeight", 1.0),
                "DesiredWeight": v.get("InitialVariantWeight", 1.0),
                "CurrentInstanceCount": v.get("InitialInstanceCount", 1),
                "DesiredInstanceCount": v.get("InitialInstanceCount", 1),
                "VariantStatus": [{"Status": status, "StartTime": now()}],
            }
            for v in config["ProductionVariants"]
        ]

    def _capture_status(self, config_name: str) -> dict | None:
        capture = self.api.get("EndpointConfig", config_name).get("DataCaptureConfig")
        if not capture:
            return None
        return {
            "EnableCapture": bool(capture.get("EnableCapture")),
            "CaptureStatus": "Started" if capture.get("EnableCapture") else "Stopped",
            "CurrentSamplingPercentage": capture.get("InitialSamplingPercentage", 100),
            "DestinationS3Uri": capture["DestinationS3Uri"],
            **({"KmsKeyId": capture["KmsKeyId"]} if capture.get("KmsKeyId") else {}),
        }

    # --- create / update / delete ---------------------------------------------------------------

    def start(self, name: str) -> None:
        threading.Thread(
            target=self._create, args=(name,), daemon=True, name=f"endpoint:{name}"
        ).start()

    def _create(self, name: str) -> None:
        config = self.api.get("Endpoint", name)["EndpointConfigName"]
        self.ctx.say("endpoint", f"{name} Creating ({config})")
        try:
            fleet = self._fleet(name, config)
        except SluiceError as e:
            self.api.update("Endpoint", name, EndpointStatus="Failed", FailureReason=str(e)[:1024])
            self.ctx.say("endpoint", f"{name} Failed: {e}")
            return
        with self.lock:
            self.live[name] = Live(fleet)
        self.api.update(
            "Endpoint",
            name,
            EndpointStatus="InService",
            ProductionVariants=self._variants(config),
            DataCaptureConfig=self._capture_status(config),
        )
        self.ctx.say("endpoint", f"{name} InService ({config})")

    def update(self, name: str, request: dict) -> None:
        self.api.update("Endpoint", name, EndpointStatus="Updating")
        threading.Thread(
            target=self._update, args=(name, request), daemon=True, name=f"endpoint-update:{name}"
        ).start()

    def _update(self, name: str, request: dict) -> None:
        new = request["EndpointConfigName"]
        deployment = request.get("DeploymentConfig") or {}
        policy = deployment.get("BlueGreenUpdatePolicy") or {}
        routing = policy.get("TrafficRoutingConfiguration") or {"Type": "ALL_AT_ONCE"}
        alarms = [
            a["AlarmName"]
            for a in (deployment.get("AutoRollbackConfiguration") or {}).get("Alarms", [])
        ]
        self.ctx.say("endpoint", f"{name} Updating to {new} ({routing['Type']})")
        try:
            green = self._fleet(name, new)
        except SluiceError as e:
            self._rolled_back(name, f"the new fleet did not pass /ping: {e}")
            return
        live = self.live[name]
        if routing["Type"] == "CANARY":
            size = routing.get("CanarySize") or {"Type": "CAPACITY_PERCENT", "Value": 10}
            share = size["Value"] / 100 if size["Type"] == "CAPACITY_PERCENT" else 0.1
            with self.lock:
                live.green, live.green_share = green, min(1.0, share)
            self.ctx.say("endpoint", f"{name} canary: {live.green_share:.0%} of requests to {new}")
            fired = self._bake(alarms, routing.get("WaitIntervalInSeconds", 0))
            if fired:
                self._abort(name, live, green, f"alarm {fired} went off during the canary bake")
                return
        with self.lock:  # all traffic to green; blue stays up until the final bake passes
            blue = live.fleet
            live.fleet, live.green, live.green_share = green, blue, 0.0
        fired = self._bake(alarms, policy.get("TerminationWaitInSeconds", 0))
        if fired:
            with self.lock:
                live.fleet, live.green = blue, None
            green.stop()
            self._rolled_back(name, f"alarm {fired} went off while the new fleet baked")
            return
        with self.lock:
            live.green = None
        blue.stop()
        self.api.update(
            "Endpoint",
            name,
            EndpointStatus="InService",
            EndpointConfigName=new,
            FailureReason=None,
            ProductionVariants=self._variants(new),
            DataCaptureConfig=self._capture_status(new),
            LastDeploymentConfig=deployment or None,
        )
        self.ctx.say("endpoint", f"{name} InService ({new})")

    def _bake(self, alarms: list[str], seconds: float) -> str | None:
        """Wait `seconds` watching the alarms; the first one in ALARM, or None."""
        deadline = time.monotonic() + float(seconds)
        while True:
            if alarms:
                states = self.alarm_states(alarms)
                fired = next((a for a in alarms if states.get(a) == "ALARM"), None)
                if fired:
                    return fired
            if time.monotonic() >= deadline or self.closed.is_set():
                return None
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def _abort(self, name: str, live: Live, green: Fleet, why: str) -> None:
        with self.lock:
            live.green, live.green_share = None, 0.0
        green.stop()
        self._rolled_back(name, why)

    def _rolled_back(self, name: str, why: str) -> None:
        self.api.update(
            "Endpoint", name, EndpointStatus="InService", FailureReason=f"Rolled back: {why}"[:1024]
        )
        self.ctx.say("endpoint", f"{name} rolled back: {why}")

    def delete(self, name: str) -> None:
        with self.lock:
            live = self.live.pop(name, None)
        if live:
            self._flush(name, live)
            live.fleet.stop()
            if live.green:
                live.green.stop()

    def restore(self) -> None:
        """After a restart: endpoints that were serving serve again (Updating rolls back)."""
        for name, r in list(self.api.resources["Endpoint"].items()):
            if r["EndpointStatus"] in ("InService", "Creating", "Updating", "SystemUpdating"):
                why = r.get("FailureReason")
                if r["EndpointStatus"] == "Updating":
                    why = "Rolled back: the local stack stopped during the update"
                self.api.update("Endpoint", name, EndpointStatus="Creating", FailureReason=why)
                self.start(name)

    def shutdown(self) -> None:
        self.closed.set()
        for name in list(self.live):
            self.delete(name)

    # --- invocations ----------------------------------------------------------------------------

    def invoke(self, name: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict, bytes]:
        """sagemaker-runtime InvokeEndpoint: (status, headers, body) as SageMaker answers."""
        record = self.api.find("Endpoint", name)
        live = self.live.get(name)
        if (
            record is None
            or live is None
            or record["EndpointStatus"] not in ("InService", "Updating")
        ):
            state = record["EndpointStatus"] if record else "missing"
            raise ApiError(
                "ValidationError", f"Endpoint {name} of account local is not InService ({state})."
            )
        with self.lock:
            fleet = live.green if live.green and random.random() < live.green_share else live.fleet
        variant, proc = fleet.pick(headers.get("x-amzn-sagemaker-target-variant"))
        content_type = headers.get("content-type", "application/octet-stream")
        forward = {
            "Content-Type": content_type,
            "Accept": headers.get("accept", "application/json"),
        }
        if "x-amzn-sagemaker-custom-attributes" in headers:
            forward["X-Amzn-SageMaker-Custom-Attributes"] = headers[
                "x-amzn-sagemaker-custom-attributes"
            ]
        try:
            conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=INVOKE_TIMEOUT_S)
            conn.request("POST", "/invocations", body=body, headers=forward)
            resp = conn.getresponse()
            status, out, out_type = resp.status, resp.read(), resp.getheader("Content-Type", "")
            conn.close()
        except (OSError, http.client.HTTPException) as e:
            raise ApiError(
                "ModelError",
                f'Received server error (0) from {variant} with message "{type(e).__name__}: {e}".',
                424,
            ) from None
        if status != 200:
            raise ApiError(
                "ModelError",
                f"Received client error ({status}) from {variant} with "
                f'message "{out.decode(errors="replace")[:1000]}".',
                424,
            )
        if fleet.capture:
            self._capture(name, live, fleet.capture, content_type, body, out_type, out)
        reply = {
            "Content-Type": out_type or "application/octet-stream",
            "x-Amzn-Invoked-Production-Variant": variant,
        }
        return 200, reply, out

    def _capture(self, name, live, cfg, in_type, body, out_type, out) -> None:
        """One capture line, as SageMaker's data capture writes it (sampled)."""
        if random.random() * 100 >= float(cfg.get("InitialSamplingPercentage", 100)):
            return
        json_types = (cfg.get("CaptureContentTypeHeader") or {}).get("JsonContentTypes") or []
        modes = {o["CaptureMode"] for o in cfg.get("CaptureOptions", [])} or {"Input", "Output"}

        def part(mode: str, ctype: str, data: bytes) -> dict:
            if ctype.split(";")[0].strip() in json_types:
                return {
                    "observedContentType": ctype,
                    "mode": mode,
                    "data": data.decode("utf-8", "replace"),
                    "encoding": "JSON",
                }
            return {
                "observedContentType": ctype,
                "mode": mode,
                "data": base64.b64encode(data).decode(),
                "encoding": "BASE64",
            }

        capture = {}
        if "Input" in modes or "InputAndOutput" in modes:
            capture["endpointInput"] = part("INPUT", in_type, body)
        if "Output" in modes or "InputAndOutput" in modes:
            capture["endpointOutput"] = part("OUTPUT", out_type, out)
        line = {
            "captureData": capture,
            "eventMetadata": {
                "eventId": str(uuid.uuid4()),
                "inferenceTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            "eventVersion": "0",
        }
        with self.lock:
            live.captured.append(json.dumps(line))

    def _flush_loop(self) -> None:
        while not self.closed.wait(5):
            for name, live in list(self.live.items()):
                self._flush(name, live)

    def _flush(self, name: str, live: Live) -> None:
        with self.lock:
            lines, live.captured = live.captured, []
            capture = live.fleet.capture
        if not lines or not capture:
            return
        t = datetime.now(UTC)
        bucket, prefix = split_s3(capture["DestinationS3Uri"].rstrip("/") + "/")
        variant = next(iter(live.fleet.variants))
        key = (
            f"{prefix}{name}/{variant}/{t:%Y/%m/%d/%H}/"
            f"{t:%M-%S}-{t.microsecond // 1000:03d}-{uuid.uuid4()}.jsonl"
        )
        self.ctx.s3.put_object(Bucket=bucket, Key=key, Body=("\n".join(lines) + "\n").encode())
