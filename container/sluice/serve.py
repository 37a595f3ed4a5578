"""The `serve` command: SageMaker's inference contract for Batch Transform and endpoints.

- `GET /ping`: 200 with an empty body once the model is loaded (503 while loading); answered by
  its own thread, never behind inference.
- `GET /execution-parameters`: MaxConcurrentTransforms, BatchStrategy, MaxPayloadInMB for this
  model and device (see `execution_parameters`).
- `POST /invocations`: JSON Lines, JSON, text or single-column CSV in; JSON Lines out, exactly one
  line per input line in input order, streamed window by window. Bad records get error lines;
  only an unreadable body is a 4xx; a body over SAGEMAKER_MAX_PAYLOAD_IN_MB is a 413.
- SIGTERM: stop accepting, finish the requests in flight, exit.

Memory per request: the payload (at most MaxPayloadInMB) plus one window of records (their token
ids and results); the model sees micro-batches under the engine's token budget.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from .batcher import Batcher
from .engine import Engine, EngineConfig, Job
from .errors import SluiceError
from .model import load_model, read_sluice_json
from .records import TASKS, BadRecord, BodyError, Defaults, dumps, error_line, parse_body

log = logging.getLogger("sluice.serve")
WINDOW = 2048  # records tokenised and submitted together; bounds per-request memory
DRAIN_S = 25  # SageMaker sends SIGKILL 30 s after SIGTERM


def execution_parameters(device: torch.device, task: str) -> dict:
    """What this container asks Batch Transform for, unless the job sets its own values.

    - MaxConcurrentTransforms: requests in flight per instance. The dynamic batcher merges them
      into device batches and overlaps HTTP/JSON/tokenising with compute: 4 on a GPU; 2 on a CPU,
      where the model already uses every core.
    - MaxPayloadInMB: generation costs about max_new_tokens forward passes per record, scoring
      one, so a generation payload is kept at 1 MB (thousands of prompts) to stay well inside
      the invocation timeout; scoring and next-token take 6 MB. SageMaker requires
      MaxConcurrentTransforms x MaxPayloadInMB <= 100.
    """
    concurrency = 4 if device.type == "cuda" else 2
    payload = 1 if task == "generate" else 6
    return {
        "MaxConcurrentTransforms": concurrency,
        "BatchStrategy": "MULTI_RECORD",
        "MaxPayloadInMB": min(payload, 100 // concurrency),
    }


def pick_device() -> torch.device:
    wanted = os.environ.get("SLUICE_DEVICE")
    if wanted:
        return torch.device(wanted)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(device: torch.device) -> torch.dtype:
    name = os.environ.get("SLUICE_DTYPE", "auto")
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def defaults_from(info: dict) -> Defaults:
    """Task defaults: SLUICE_TASK / SLUICE_PARAMETERS over the model's sluice.json ones."""
    task = os.environ.get("SLUICE_TASK") or info.get("task") or "generate"
    if task not in TASKS:
        raise SluiceError(f"SLUICE_TASK={task!r}: choose one of {list(TASKS)}")
    params: dict[str, dict] = {}
    if "max_new_tokens" in info:
        params["generate"] = {"max_new_tokens": int(info["max_new_tokens"])}
    env = os.environ.get("SLUICE_PARAMETERS")
    if env:
        try:
            extra = json.loads(env)
        except json.JSONDecodeError as e:
            raise SluiceError(f"SLUICE_PARAMETERS is not JSON: {e.msg}") from None
        # either {"generate": {...}, "score": {...}} or one flat dict for the default task
        per_task = extra if set(extra) <= set(TASKS) else {task: extra}
        for t, p in per_task.items():
            params.setdefault(t, {}).update(p)
    return Defaults(task, params)


class State:
    """What the handlers share: the model once loaded, limits, and the in-flight count."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir
        self.ready = threading.Event()
        self.draining = False
        self.in_flight = 0
        self.lock = threading.Lock()
        self.max_payload = int(float(os.environ.get("SAGEMAKER_MAX_PAYLOAD_IN_MB", "6")) * 2**20)
        batch = os.environ.get("SAGEMAKER_BATCH", "").lower() == "true"
        # Batch Transform's InvocationsTimeoutInSeconds defaults to 600; endpoints allow 60
        default_budget = 540 if batch else 55
        self.budget_s = float(os.environ.get("SLUICE_INVOCATION_TIMEOUT", default_budget))
        self.device = pick_device()
        self.engine: Engine | None = None
        self.batcher: Batcher | None = None
        self.defaults = Defaults()

    def load(self) -> None:
        t0 = time.perf_counter()
        dtype = pick_dtype(self.device)
        model, tok = load_model(self.model_dir, dtype=dtype)
        model.to(self.device)
        info = read_sluice_json(self.model_dir).get("task_defaults", {})
        self.defaults = defaults_from(info)
        self.engine = Engine(model, tok, EngineConfig.from_env(self.device, info))
        wait_ms = float(os.environ.get("SLUICE_BATCH_WAIT_MS", "5"))
        self.batcher = Batcher(self.engine, max_wait_s=wait_ms / 1000)
        self.ready.set()
        log.info(
            "model %s loaded on %s (%s) in %.1f s; default task %s",
            self.model_dir,
            self.device,
            dtype,
            time.perf_counter() - t0,
            self.defaults.task,
        )


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sluice"
    state: State  # set on the subclass made by make_server

    def log_message(self, fmt, *args):  # one structured line per request instead of stderr noise
        log.debug("%s %s", self.address_string(), fmt % args)

    def _send(self, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(status)
        if body or status != 200:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if status >= 400:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        log.warning("invocation refused (%d): %s", status, message)
        self._send(status, json.dumps({"error": {"code": status, "message": message}}).encode())

    def do_GET(self):
        if self.path == "/ping":
            if self.state.ready.is_set() and not self.state.draining:
                self._send(200)
            else:
                self._send(
                    503, b"loading" if not self.state.draining else b"stopping", "text/plain"
                )
        elif self.path == "/execution-parameters":
            task = self.state.defaults.task
            params = execution_parameters(self.state.device, task)
            self._send(200, json.dumps(params).encode())
        else:
            self._error(404, f"no such path {self.path}; use /ping or /invocations")

    def do_POST(self):
        if self.path != "/invocations":
            self._error(404, f"no such path {self.path}; POST to /invocations")
            return
        st = self.state
        if st.draining:
            self._error(503, "the server is shutting down")
            return
        if not st.ready.wait(timeout=st.budget_s):
            self._error(503, "the model is still loading")
            return
        length = self.headers.get("Content-Length")
        if length is None:
            self._error(411, "send a Content-Length header")
            return
        if int(length) > st.max_payload:
            self._error(
                413,
                f"payload of {int(length)} bytes is over SAGEMAKER_MAX_PAYLOAD_IN_MB "
                f"({st.max_payload // 2**20} MB): lower MaxPayloadInMB or split the input",
            )
            return
        with st.lock:
            st.in_flight += 1
        try:
            self._invoke(self.rfile.read(int(length)))
        finally:
            with st.lock:
                st.in_flight -= 1

    def _invoke(self, body: bytes) -> None:
        st = self.state
        t0 = time.monotonic()
        deadline = t0 + st.budget_s
        try:
            records = parse_body(body, self.headers.get("Content-Type"), st.defaults)
        except BodyError as e:
            self._error(e.status, str(e))
            return
        as_array = (self.headers.get("Accept") or "").split(";")[0].strip() == "application/json"
        self.send_response(200)
        self.send_header(
            "Content-Type", "application/json" if as_array else "application/jsonlines"
        )
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        n, first = 0, True
        if as_array:
            self._chunk(b"[")
        pending = None
        for window in _windows(records, WINDOW):
            prepared = st.engine.prepare(
                [r for r in window if not isinstance(r, BadRecord)], deadline
            )
            slots, jobs, it = [], [], iter(prepared)
            for r in window:
                if isinstance(r, BadRecord):
                    slots.append(error_line(r))
                else:
                    p = next(it)
                    slots.append(p)
                    if isinstance(p, Job):
                        jobs.append(p)
            fut = st.batcher.submit(jobs)  # tokenise the next window while this one runs
            if pending is not None:
                first = self._flush(*pending, first, as_array)
            pending = (slots, fut)
            n += len(window)
        if pending is not None:
            self._flush(*pending, first, as_array)
        if as_array:
            self._chunk(b"]")
        self._chunk(b"")
        log.info("invocation: %d records in %.2f s", n, time.monotonic() - t0)

    def _flush(self, slots, fut, first: bool, as_array: bool) -> bool:
        fut.result()
        lines = [dumps(s.result if isinstance(s, Job) else s) for s in slots]
        if not lines:
            return first
        sep = "," if as_array else "\n"
        text = sep.join(lines)
        self._chunk(((sep if not first else "") + text).encode())
        return False

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))


def _windows(records, size: int):
    window = []
    for r in records:
        window.append(r)
        if len(window) >= size:
            yield window
            window = []
    if window:
        yield window


def make_server(state: State, port: int, host: str = "0.0.0.0") -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


def serve(model_dir: Path, port: int | None = None, host: str = "0.0.0.0") -> int:
    """Run until SIGTERM/SIGINT; returns the exit code."""
    port = port or int(os.environ.get("SAGEMAKER_BIND_TO_PORT", "8080"))
    state = State(model_dir)
    server = make_server(state, port, host)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    log.info("listening on %s:%d, loading %s", host, server.server_address[1], model_dir)
    try:
        state.load()
    except SluiceError as e:
        log.error("cannot serve: %s", e)
        server.shutdown()
        return 1
    print(f"sluice serve: ready on port {server.server_address[1]}", flush=True)
    while not stop.wait(timeout=1.0):
        pass
    log.info("SIGTERM: refusing new requests, draining %d in flight", state.in_flight)
    state.draining = True
    server.shutdown()  # stop accepting
    server.server_close()
    t0 = time.monotonic()
    while state.in_flight and time.monotonic() - t0 < DRAIN_S:
        time.sleep(0.05)
    state.batcher.close()
    log.info("stopped (%d left in flight)", state.in_flight)
    sys.stdout.flush()
    return 0
