"""Test helpers: tiny hyperparameters, a runner for the real `sluice` CLI, a `sluice serve`."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.config import Config

REPO = Path(__file__).resolve().parents[1]

# Figures a test measured, printed at the end of the run (tests/conftest.py)
FIGURES: list[str] = []

# Small enough for 2 CPU cores, big enough that loss visibly falls.
TINY = {
    "model_size": "tiny",
    "vocab_size": "384",
    "n_positions": "64",
    "block_size": "32",
    "batch_size": "8",
    "learning_rate": "0.003",
    "warmup_steps": "5",
    "log_interval": "5",
    "checkpoint_interval": "0",
    "validation_fraction": "0.1",
    "edge_seq_len": "16",
    "export_edge": "false",
    "loss_curve": "false",
    "max_steps": "30",
}


def template_resource(logical_id: str) -> dict:
    """One resource of template.yaml as written (intrinsic functions left as they are)."""
    from cfnlint.decode import cfn_yaml

    return cfn_yaml.load(str(REPO / "template.yaml"))["Resources"][logical_id]


def lambda_env(**extra: str) -> dict[str, str]:
    """What template.yaml gives every function (Globals), as the handler tests set it, with
    moto's credentials and region, plus each test's own variables."""
    return {
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "POWERTOOLS_METRICS_NAMESPACE": "Sluice",
        "STAGE": "dev",
        "DATA_BUCKET": "sluice-dev-data",
        **extra,
    }


def hp(**overrides) -> dict[str, str]:
    """TINY hyperparameters with overrides, all as strings (as SageMaker passes them)."""
    return {**TINY, **{k: str(v) for k, v in overrides.items()}}


def sets(params: dict[str, str]) -> list[str]:
    return [a for k, v in params.items() for a in ("--set", f"{k}={v}")]


def run_sluice(
    *args: str,
    env: dict | None = None,
    timeout: int = 600,
    check: bool = True,
    module: str = "sluice.cli",
) -> subprocess.CompletedProcess:
    """Run the real `sluice` command (or another `module`'s) in a subprocess, capture its output."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{module} {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n"
            f"{proc.stderr[-4000:]}"
        )
    return proc


def run_local(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """Run the real `sluice-local` command (the emulator's side: transform, quickstart)."""
    return run_sluice(*args, module="sluice_local.cli", **kwargs)


def train_losses(stdout: str) -> list[float]:
    """train_loss values from the log, read with the documented MetricDefinitions regex."""
    import re

    from sluice.metrics import METRIC_DEFINITIONS

    rx = re.compile(next(d["Regex"] for d in METRIC_DEFINITIONS if d["Name"] == "train_loss"))
    return [float(m.group(1)) for m in rx.finditer(stdout)]


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


@dataclass
class LambdaContext:
    """What Powertools reads from a Lambda context object."""

    function_name: str = "sluice-dev-function"
    memory_limit_in_mb: int = 256
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:sluice"
    aws_request_id: str = "req-1"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class MotoServer:
    """moto's S3 (and the rest) over real HTTP, for the container's own boto3 calls: `env` is
    what a container process needs to reach it, `s3` a client of it."""

    def __init__(self):
        from moto.server import ThreadedMotoServer

        port = free_port()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self.server.start()
        self.env = {**AWS_TEST_ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
        self.s3 = boto3.client(
            "s3",
            endpoint_url=self.env["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def stop(self) -> None:
        self.server.stop()


class Server:
    def __init__(self, model_dir, **env):
        self.env = env  # what the test added to the environment
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sluice.cli",
                "serve",
                "--model-dir",
                str(model_dir),
                "--host",
                "127.0.0.1",
            ],
            env={
                **os.environ,
                "SAGEMAKER_BIND_TO_PORT": str(self.port),
                "PYTHONUNBUFFERED": "1",
                **env,
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.log: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 240:  # vLLM: 40-110 s on 2 busy cores
            try:
                if self.get("/ping")[0] == 200:
                    return
            except OSError:
                pass
            assert self.proc.poll() is None, "".join(self.log)
            time.sleep(0.1)
        raise AssertionError("server did not become ready:\n" + "".join(self.log))

    def _drain(self):
        for line in self.proc.stdout:
            self.log.append(line)

    def conn(self, timeout=300) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def get(self, path):
        c = self.conn(timeout=5)
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read()

    def post(self, body: bytes | str, ctype="application/jsonlines", accept=None):
        c = self.conn()
        headers = {"Content-Type": ctype, **({"Accept": accept} if accept else {})}
        c.request("POST", "/invocations", body=body, headers=headers)
        r = c.getresponse()
        return r.status, r.read().decode(), dict(r.getheaders())

    def lines(self, records: list[dict]) -> list[dict]:
        status, text, _ = self.post("\n".join(json.dumps(r) for r in records))
        assert status == 200, text
        return [json.loads(line) for line in text.split("\n")]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)


class EchoContainer:
    """SageMaker's container contract (/ping, /execution-parameters, /invocations) answering
    each request with its own body: one output line per input line at the speed of HTTP, for
    what the transform driver does with big files, not what a model does with records."""

    def __init__(self, payload_mb: int = 6):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        params = {"MaxConcurrentTransforms": 1, "BatchStrategy": "MULTI_RECORD"}
        params["MaxPayloadInMB"] = payload_mb

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps(params).encode() if "execution" in self.path else b"{}"
                self._answer(body)

            def do_POST(self):
                self._answer(self.rfile.read(int(self.headers["Content-Length"])))

            def _answer(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self) -> str:
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def peak_rss_mb(cmd: list[str], **kw) -> float:
    """Run a command to its end (AssertionError if it fails); its peak resident memory in MB,
    from its own rusage (not the largest of every child this process ever waited for)."""
    import tempfile

    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, **kw)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            err.seek(0)
            raise AssertionError(f"{cmd} exited {proc.returncode}: {err.read()[-2000:]!r}")
    return usage.ru_maxrss / 1024


def chromium() -> str:
    """Debian's chromium (`make system-packages` installs it; CI does). Missing: a failure in CI, a
    skip elsewhere, naming the command."""
    import shutil

    import pytest

    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is missing: `make system-packages` installs Debian's chromium")
    pytest.skip("no chromium on this machine: `make system-packages` installs Debian's chromium")


def running_stack(tmp_path_factory, name: str, overrides: list[str], args: tuple[str, ...] = ()):
    """A module's `sluice-local up` on a fresh state folder (with these extra arguments),
    stopped after its tests."""
    state = tmp_path_factory.mktemp(name) / "state"
    state.mkdir()
    stack = LocalUp(state, overrides, args).start()
    yield stack
    if stack.proc.poll() is None:
        stack.stop()


class LocalUp:
    """One `sluice-local up` process (started, stopped, started again) and what its users hold."""

    def __init__(self, state: Path, overrides: list[str], args: tuple[str, ...] = ()):
        self.state = state
        self.overrides = overrides
        self.args = args
        self.proc: subprocess.Popen | None = None

    def start(self, **env: str) -> LocalUp:
        """`sluice-local up` with these extra environment variables, once it is ready."""
        ready = self.state / "ready.json"
        ready.unlink(missing_ok=True)
        self.log = open(self.state.parent / "local-up.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sluice_local.cli",
                "up",
                "--state",
                str(self.state),
                "--port",
                "0",
                "--ready-file",
                str(ready),
                *self.args,
                "--parameter-overrides",
                *self.overrides,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **env},
        )
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert self.proc.poll() is None, f"local up exited: {self.tail()}"
            assert time.monotonic() < deadline, f"local up not ready: {self.tail()}"
            time.sleep(0.5)
        from sluice_local.demo import Users

        self.status = json.loads(ready.read_text())
        self.endpoint = self.status["endpoint"]
        self.users = Users(self.client, self.status["outputs"], self.state / "logs")
        return self

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)  # Ctrl-C
        rc = self.proc.wait(timeout=120)
        self.log.close()
        return rc

    def client(self, service: str):
        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
            config=Config(retries={"max_attempts": 2}),
        )

    def tail(self) -> str:
        return (self.state.parent / "local-up.log").read_text(errors="replace")[-3000:]

    def events(self) -> str:
        return (self.state / "logs" / "events.log").read_text()

    def execution(self, name_prefix: str) -> dict:
        return self.users.finished_execution(name_prefix)


def tiny_llama(folder: Path, tokenizer_from: Path, heads: int = 4) -> Path:
    """A Llama-architecture model (random weights) with a trained tokenizer: the base to adapt.
    vLLM's CPU attention needs heads of 32+ dimensions: heads=2 for a model that is served."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_from)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=128,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
