"""The `serve` command: SageMaker's inference contract for Batch Transform and endpoints.

- `GET /ping`: 200 with an empty body once the model is loaded (503 while loading); answered by
  its own thread, never behind inference.
- `GET /execution-parameters`: MaxConcurrentTransforms, BatchStrategy, MaxPayloadInMB for this
  model and device (see `execution_parameters`).
- `POST /invocations`: JSON Lines, JSON, text or single-column CSV in; JSON Lines out, exactly one
  line per input line in input order, streamed window by window. Bad records get error lines;
  only an unreadable body is a 4xx; a body over SAGEMAKER_MAX_PAYLOAD_IN_MB is a 413, a bad
  Content-Length a 400. With MaxPayloadInMB=0 (SageMaker's "unlimited": chunked transfer
  encoding) line-based bodies are read and answered as they stream in.
- SIGTERM: stop accepting, finish the requests in flight, exit.

Every record goes to vLLM's engine as soon as it is tokenised (engine.py); records of all requests
in flight are batched together there. Memory per request: the payload plus one window of records.
A client that disconnects has its remaining records aborted.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import select
import signal
import socket
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch

from .base_ref import with_base
from .batcher import Batcher, TorchScorer
from .engine import (
    EngineConfig,
    Job,
    VllmEngine,
    check_runnable,
    error_result,
    prepare,
    vllm_adapter,
)
from .errors import SluiceError
from .lora import merge_adapter, named_adapters, unmerged_adapter
from .model import (
    check_causal,
    context_length,
    ensure_pad_token,
    load_model,
    merged_copy,
    read_sluice_json,
)
from .openai_batch import error_output, output_line
from .records import (
    PARAMETERS,
    TASKS,
    BadRecord,
    BodyError,
    Defaults,
    Record,
    check_param,
    dumps,
    error_line,
    parse_body,
    parse_stream,
)

log = logging.getLogger("sluice.serve")
WINDOW = 2048  # records tokenised and submitted together; bounds per-request memory
# generation_config.json fields that are also record parameters (Hugging Face names)
GENERATION_FIELDS = (
    "max_new_tokens",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
)
DISCARD_MAX = 256 * 2**20  # an over-limit body up to this size is read and dropped before the 413
DRAIN_S = 25  # SageMaker sends SIGKILL 30 s after SIGTERM


def execution_parameters(gpus: int, task: str) -> dict:
    """What this container asks Batch Transform for, unless the job sets its own values.

    - MaxConcurrentTransforms: requests in flight per instance. vLLM batches the records of all of
      them continuously, so more requests keep its batch full: 4 per GPU (the engine spans them
      all, tensor parallel), up to 16; 2 on a CPU, where the model already uses every core.
    - MaxPayloadInMB: generation costs about max_new_tokens forward passes per record, scoring
      one, so a generation payload is kept at 1 MB (thousands of prompts) to stay well inside
      the invocation timeout; scoring and next-token take 6 MB. SageMaker requires
      MaxConcurrentTransforms x MaxPayloadInMB <= 100.
    """
    concurrency = min(16, 4 * gpus) if gpus else 2
    payload = 1 if task in ("generate", "chat") else 6
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


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# CPU instruction sets that run bfloat16 matmuls natively (oneDNN uses them); without one, bf16 is
# emulated and slower than float32
NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def checkpoint_dtype(model_dir: Path | str) -> str | None:
    """The dtype a checkpoint's config.json says its weights are saved in (`dtype`, or the older
    `torch_dtype`), or None when it says none."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    name = cfg.get("dtype") or cfg.get("torch_dtype")
    return name if name in DTYPES else None


def cpu_bf16_flags(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """This CPU's native bfloat16 instruction sets (empty: none, or not Linux)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return []
    flags = next(
        (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
    )
    return [f for f in NATIVE_BF16_FLAGS if f in flags]


def pick_dtype(
    device: torch.device, model_dir: Path | str | None = None
) -> tuple[torch.dtype, str]:
    """The dtype to serve in, and why (logged at start).

    `SLUICE_DTYPE=auto` (the default) follows the checkpoint: float32 stays float32 (vLLM's own
    `auto` casts it to bf16 on CPUs); bfloat16 stays bfloat16 on GPUs that have it and on CPUs
    with native bf16 (AMX or AVX512-BF16), else float32; float16 stays float16 on GPUs and
    becomes bfloat16 on such CPUs (vLLM 0.32 keeps float16 there: 1.9x the time,
    docs/benchmarks.md). On GPUs a float32 checkpoint runs in bfloat16 (half the memory traffic;
    vLLM casts float32 down too), and on GPUs without bf16 (T4) anything but float16 in float32.
    """
    name = os.environ.get("SLUICE_DTYPE", "auto")
    if name != "auto":
        if name not in DTYPES:
            raise SluiceError(f"SLUICE_DTYPE={name!r}: choose auto or one of {list(DTYPES)}")
        return DTYPES[name], "SLUICE_DTYPE"
    saved = checkpoint_dtype(model_dir) if model_dir is not None else None
    if device.type == "cuda":
        if saved == "float16":
            return torch.float16, "the checkpoint's"
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, f"bf16 on this GPU (checkpoint: {saved or 'unstated'})"
        # e.g. a T4 (g4dn): bf16 weights can overflow float16, so they run in float32
        return torch.float32, f"this GPU has no bf16 (checkpoint: {saved or 'unstated'})"
    if saved in ("bfloat16", "float16"):
        native = cpu_bf16_flags()
        if native:
            why = "the checkpoint's" if saved == "bfloat16" else "float16 checkpoint, bf16 on CPU"
            return torch.bfloat16, f"{why}; this CPU has native bf16 ({', '.join(native)})"
        return (
            torch.float32,
            f"{saved} checkpoint upcast: this CPU has no native bf16 (AMX, AVX512-BF16)",
        )
    return (
        torch.float32,
        f"the checkpoint's ({saved})" if saved else "float32 (checkpoint: unstated)",
    )


def generation_defaults(model_dir: Path) -> dict:
    """The model's own generation settings (generation_config.json), as record parameters.

    Hugging Face semantics: temperature/top-k/top-p apply only with do_sample=true, so do_sample
    is always set from the file (false when absent). A value the server would refuse in a record
    is skipped with a warning, not served.
    """
    f = Path(model_dir) / "generation_config.json"
    if not f.exists():
        return {}
    try:
        cfg = json.loads(f.read_text())
    except (OSError, json.JSONDecodeError) as e:
        log.warning("generation_config.json ignored: %s", e)
        return {}
    out = {"do_sample": False}
    for name in GENERATION_FIELDS:
        if cfg.get(name) is None:
            continue
        try:
            out[name] = check_param("generate", name, cfg[name])
        except ValueError as e:
            log.warning("generation_config.json: %s; not applied", e)
    if out.get("top_k") == 0 and "top_k" in cfg:
        out.pop("top_k")
    return out


def defaults_from(info: dict, model_dir: Path | None = None) -> Defaults:
    """Task defaults, lowest first: generation_config.json, sluice.json, SLUICE_PARAMETERS.

    SLUICE_TASK (else sluice.json's task, else generate) is the task of records naming none.
    """
    task = os.environ.get("SLUICE_TASK") or info.get("task") or "generate"
    if task not in TASKS:
        raise SluiceError(f"SLUICE_TASK={task!r}: choose one of {list(TASKS)}")
    params: dict[str, dict] = {}
    gen = generation_defaults(model_dir) if model_dir is not None else {}
    if gen:
        params["generate"] = gen
    if "max_new_tokens" in info:
        params.setdefault("generate", {})["max_new_tokens"] = int(info["max_new_tokens"])
    env = os.environ.get("SLUICE_PARAMETERS")
    if env:
        try:
            extra = json.loads(env)
        except json.JSONDecodeError as e:
            raise SluiceError(f"SLUICE_PARAMETERS is not JSON: {e.msg}") from None
        # either {"generate": {...}, "score": {...}} or one flat dict for the default task
        per_task = extra if set(extra) <= set(TASKS) else {task: extra}
        for t, p in per_task.items():
            params.setdefault("generate" if t == "chat" else t, {}).update(p)
    for t, p in params.items():  # a bad default fails at start-up, not on every record
        unknown = set(p) - set(PARAMETERS[t]) - {"truncation"}
        if unknown:
            raise SluiceError(f"default parameters for {t}: unknown {sorted(unknown)}")
    return Defaults(task, params)


class State:
    """What the handlers share: the engine once loaded, limits, and the in-flight count."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir
        self.ready = threading.Event()
        self.draining = False
        self.in_flight = 0
        self.lock = threading.Lock()
        # SageMaker's MaxPayloadInMB; 0 is its "unlimited" (chunked transfer encoding)
        self.max_payload = int(float(os.environ.get("SAGEMAKER_MAX_PAYLOAD_IN_MB", "6")) * 2**20)
        self.batch = os.environ.get("SAGEMAKER_BATCH", "").lower() == "true"
        # Batch Transform's InvocationsTimeoutInSeconds defaults to 600; endpoints allow 60
        default_budget = 540 if self.batch else 55
        self.budget_s = float(os.environ.get("SLUICE_INVOCATION_TIMEOUT", default_budget))
        self.device = pick_device()
        self.gpus = torch.cuda.device_count() if self.device.type == "cuda" else 0
        self.engine: VllmEngine | None = None
        # torch scoring (CPU default), loaded on first use: one per adapter (None: as served)
        self.scorers: dict[str | None, Batcher] = {}
        self._scorer_lock = threading.Lock()
        self.tok = None
        self.dtype = torch.float32  # set by load(): the engine's, and torch scoring's
        self.context = 0
        self.config = EngineConfig()
        self.defaults = Defaults()
        self._merged: tempfile.TemporaryDirectory | None = None

    def load(self) -> None:
        from transformers import AutoConfig, AutoTokenizer

        t0 = time.perf_counter()
        self.model_dir = with_base(self.model_dir)  # a model that names its base: fetch it
        check_causal(self.model_dir)
        check_runnable(self.model_dir, self.gpus > 0)
        self.dtype, why = pick_dtype(self.device, self.model_dir)
        log.info("dtype %s: %s", str(self.dtype).removeprefix("torch."), why)
        try:
            self.tok = AutoTokenizer.from_pretrained(self.model_dir)
        except (OSError, ValueError) as e:
            raise SluiceError(f"{self.model_dir}: cannot load the tokenizer ({e})") from None
        ensure_pad_token(self.tok)
        self.context = context_length(AutoConfig.from_pretrained(self.model_dir))
        info = read_sluice_json(self.model_dir)
        self.defaults = defaults_from(info.get("task_defaults", {}), self.model_dir)
        self.config = EngineConfig.from_env(self.gpus > 0, self.defaults.params.get("generate"))
        served, adapter = self.model_dir, None
        lora = unmerged_adapter(self.model_dir, info)
        if lora is not None:
            adapter = vllm_adapter(self.model_dir, lora)
            if adapter is None:  # vLLM cannot apply it (architecture, rank): serve it merged
                self._merged = tempfile.TemporaryDirectory(prefix="sluice-merged-")
                served = merged_copy(self.model_dir, Path(self._merged.name))
                log.warning(
                    "vLLM cannot apply this LoRA adapter (no LoRA support for the architecture, "
                    "or a rank above 512): serving it merged into a copy of the base (%s)",
                    served,
                )
        adapters = {}
        named = named_adapters(self.model_dir)
        if named and lora is not None:
            raise SluiceError(
                f"{self.model_dir}: a model published with lora_merge=false carries its own "
                "adapter; named adapters (adapters/) go on a plain base model"
            )
        for name, path in named.items():
            adapters[name] = vllm_adapter(self.model_dir, path)
            if adapters[name] is None:  # no merged fallback: each would need its own model
                raise SluiceError(
                    f"{path}: vLLM cannot apply LoRA adapters to this model (no LoRA support for "
                    "its architecture, or a rank above 512); serve each adapter merged into its "
                    "own model instead"
                )
        self.defaults.adapters = tuple(adapters)
        self.engine = VllmEngine(
            served,
            self.tok,
            self.context,
            str(self.dtype).split(".")[-1],
            self.config,
            adapter,
            batch=self.batch,
            adapters=adapters,
        )
        self.score_engine = os.environ.get("SLUICE_SCORE_ENGINE") or (
            "vllm" if self.gpus else "torch"
        )
        if self.score_engine == "vllm" and (adapters or adapter is not None):
            # vLLM 0.32's prompt log-probs with LoRA on crash its engine once a scored record
            # shares a step with others (einsum shape error in add_lora_logits; measured on the
            # CPU build): with adapters, scoring runs in torch, each adapter merged into a copy
            log.warning("LoRA adapters are served: scoring runs in torch, not vLLM")
            self.score_engine = "torch"
        if self.score_engine == "torch" and self.defaults.task == "score":
            self.torch_scorer()
        self.ready.set()
        log.info(
            "model %s ready on %s (%s) in %.1f s; default task %s; scoring with %s",
            self.model_dir,
            self.device,
            self.dtype,
            time.perf_counter() - t0,
            self.defaults.task,
            self.score_engine,
        )

    def torch_scorer(self, adapter: str | None = None) -> Batcher:
        """The Hugging Face model for torch scoring (with the named `adapter` merged into a copy
        of the base), loaded once, on first use."""
        with self._scorer_lock:
            if adapter not in self.scorers:
                model, tok = load_model(self.model_dir, dtype=self.dtype)
                if adapter is not None:
                    model = merge_adapter(model, self.engine.adapters[adapter].path)
                model.to(self.device)
                wait_ms = float(os.environ.get("SLUICE_BATCH_WAIT_MS", "5"))
                scorer = TorchScorer(model, tok, self.context, self.config)
                self.scorers[adapter] = Batcher(scorer, max_wait_s=wait_ms / 1000)
            return self.scorers[adapter]

    def submit(self, jobs: list[Job]) -> list[concurrent.futures.Future]:
        """Start every job; one future per job (torch scoring: one shared by its batch)."""
        by_torch: dict[str | None, list[Job]] = {}  # torch scoring: a batch per adapter
        for j in jobs:
            if j.record.task == "score" and self.score_engine == "torch":
                by_torch.setdefault(j.record.adapter, []).append(j)
        shared = {a: self.torch_scorer(a).submit(group) for a, group in by_torch.items()}
        return [
            shared[j.record.adapter]
            if j.record.task == "score" and self.score_engine == "torch"
            else self.engine.submit(j)
            for j in jobs
        ]

    def close(self) -> None:
        for scorer in self.scorers.values():
            scorer.close()
        if self.engine is not None:
            self.engine.close()
        if self._merged is not None:
            self._merged.cleanup()


class ClientGone(Exception):
    """The client closed the connection before its answer was complete."""


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
            if self.state.engine is not None and self.state.engine.check():
                self._send(500, b"engine failed", "text/plain")
            elif self.state.ready.is_set() and not self.state.draining:
                self._send(200)
            else:
                self._send(
                    503, b"loading" if not self.state.draining else b"stopping", "text/plain"
                )
        elif self.path == "/execution-parameters":
            params = execution_parameters(self.state.gpus, self.state.defaults.task)
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
        body = self._read_body()
        if body is None:
            return
        with st.lock:
            st.in_flight += 1
        try:
            self._invoke(body)
        except (ClientGone, BrokenPipeError, ConnectionResetError):
            log.warning("client went away: its remaining records were aborted")
            self.close_connection = True
        finally:
            with st.lock:
                st.in_flight -= 1

    def _read_body(self) -> bytes | list[bytes] | None:
        """The body, or its chunks as they come (unlimited chunked), or None once refused."""
        st = self.state
        chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        length = self.headers.get("Content-Length")
        if chunked:
            chunks = read_chunks(self.rfile)
            if st.max_payload == 0:
                return chunks  # streamed: records are answered while the body arrives
            body, size = bytearray(), 0
            try:
                for c in chunks:
                    size += len(c)
                    if size > st.max_payload:
                        self._too_large(size)
                        return None
                    body += c
            except BodyError as e:
                self._error(e.status, str(e))
                return None
            return bytes(body)
        if length is None:
            self._error(411, "send a Content-Length header (or Transfer-Encoding: chunked)")
            return None
        if not length.strip().isdigit():
            self._error(400, f"Content-Length {length!r} is not a byte count")
            return None
        if st.max_payload and int(length) > st.max_payload:
            # read what a client is still sending (within reason), so it can read the 413 instead
            # of a connection reset mid-upload
            left = int(length) if int(length) <= DISCARD_MAX else 0
            while left > 0:
                got = len(self.rfile.read(min(left, 1 << 20)))
                if not got:
                    break
                left -= got
            self._too_large(int(length))
            return None
        body = self.rfile.read(int(length))
        if len(body) < int(length):
            self._error(400, f"the body ended after {len(body)} of {int(length)} bytes")
            return None
        return body

    def _too_large(self, size: int) -> None:
        self._error(
            413,
            f"payload of {size} bytes is over SAGEMAKER_MAX_PAYLOAD_IN_MB "
            f"({self.state.max_payload // 2**20} MB): lower MaxPayloadInMB or split the input",
        )

    def _invoke(self, body: bytes | object) -> None:
        st = self.state
        t0 = time.monotonic()
        deadline = t0 + st.budget_s
        ctype = self.headers.get("Content-Type")
        try:
            if isinstance(body, bytes):
                records = parse_body(body, ctype, st.defaults)
            else:
                records = parse_stream(body, ctype, st.defaults)
        except BodyError as e:
            self._error(e.status, str(e))
            return
        self.streaming = not isinstance(body, bytes)
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
        try:
            for window in _windows(records, WINDOW):
                good = [r for r in window if not isinstance(r, BadRecord)]
                prepared = iter(prepare(st.tok, st.context, st.config, good, deadline))
                slots = [
                    (r, error_line(r) if isinstance(r, BadRecord) else next(prepared))
                    for r in window
                ]
                jobs = [x for _, x in slots if isinstance(x, Job)]
                futures = dict(zip(map(id, jobs), st.submit(jobs), strict=True))
                # the next window is parsed and tokenised while this one runs
                if pending is not None:
                    first = self._flush(*pending, first, as_array)
                pending = (slots, futures)
                n += len(window)
            if pending is not None:
                first = self._flush(*pending, first, as_array)
                pending = None
        except BodyError as e:  # a streamed body broke off mid-way: what was read is answered
            log.warning("body stream broke off after %d records: %s", n, e)
        finally:
            if pending is not None:
                for f in pending[1].values():
                    f.cancel()
        if as_array:
            self._chunk(b"]")
        self._chunk(b"")
        log.info("invocation: %d records in %.2f s", n, time.monotonic() - t0)

    def _flush(self, slots, futures, first: bool, as_array: bool) -> bool:
        lines = []
        try:
            for rec, s in slots:
                if isinstance(s, Job):
                    self._wait(futures[id(s)])
                lines.append(_line(rec, s))
        except ClientGone:
            for f in futures.values():
                f.cancel()
            raise
        if not lines:
            return first
        sep = "," if as_array else "\n"
        text = sep.join(lines)
        self._chunk(((sep if not first else "") + text).encode())
        return False

    def _wait(self, fut: concurrent.futures.Future) -> None:
        """Wait for one record, noticing meanwhile if the client has gone away."""
        while True:
            try:
                fut.result(timeout=1.0)
                return
            except concurrent.futures.TimeoutError:
                if not self.streaming and client_gone(self.connection):
                    raise ClientGone from None

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))


def _line(rec: Record | BadRecord, slot) -> str:
    """One output line (an OpenAI batch output line for an OpenAI request line); a result that
    cannot be written as JSON becomes that record's error."""
    result = slot.result if isinstance(slot, Job) else slot
    try:
        return dumps(result if rec.openai is None else output_line(rec.openai, result))
    except (ValueError, TypeError) as e:
        if rec.openai is not None:
            return dumps(error_output(rec.openai, "internal_error", f"unwritable result: {e}"))
        return dumps(error_result(rec, "internal_error", f"unwritable result: {e}"))


def client_gone(sock: socket.socket) -> bool:
    """True when the peer has closed its end (readable with nothing to read)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def read_chunks(rfile):
    """The chunks of a chunked request body (RFC 9112 7.1); BodyError on a malformed one."""
    while True:
        line = rfile.readline(1024)
        size_text = line.split(b";")[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise BodyError(400, f"malformed chunk size {size_text[:20]!r}") from None
        if size == 0:
            while rfile.readline(1024) not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return
        data = rfile.read(size)
        if len(data) < size:
            raise BodyError(400, "the body ended inside a chunk")
        rfile.readline(8)  # the chunk's CRLF
        yield data


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
    # vLLM's engine process is forked from this one (engine.py): it must not hold the listening
    # socket, or connections made while serve stops would wait on it instead of being refused
    os.register_at_fork(after_in_child=server.socket.close)
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
        if state.engine.check():  # a dead engine answers nothing: exit, the platform restarts us
            break
    failed = state.engine.failed
    if failed:
        log.error("exiting: the vLLM engine died (%s)", failed)
    else:
        log.info("SIGTERM: refusing new requests, draining %d in flight", state.in_flight)
    state.draining = True
    server.shutdown()  # stop accepting
    server.server_close()
    t0 = time.monotonic()
    while state.in_flight and time.monotonic() - t0 < DRAIN_S:
        time.sleep(0.05)
    state.close()
    log.info("stopped (%d left in flight)", state.in_flight)
    sys.stdout.flush()
    return 1 if failed else 0
