"""`sluice-local transform`: SageMaker's side of a Batch Transform on this machine, against the
image's real `sluice serve` process.

Follows CreateTransformJob's semantics: inputs under a local folder or an `s3://` prefix (any S3
endpoint: AWS_ENDPOINT_URL or --endpoint-url, moto's included) or listed by a manifest file;
SplitType Line/None; BatchStrategy MultiRecord (whole lines packed up to MaxPayloadInMB, never
mixing files) or SingleRecord; MaxConcurrentTransforms requests in flight; AssembleWith Line/None;
JoinSource Input; each input's output at `<output>/<key relative to the input prefix>.out`.
Precedence of settings as in SageMaker: the job's values, then the container's
/execution-parameters, then the defaults. A request that fails after retries fails its file (no
`.out`), as SageMaker does; the others complete.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from http.client import HTTPException
from pathlib import Path
from typing import BinaryIO

from tqdm import tqdm

from sluice.errors import SluiceError
from sluice.records import split_lines
from sluice.s3uri import is_s3, split_s3

from . import processes

log = logging.getLogger("sluice_local.transform")

# objects opened ahead of the one being split, and finished outputs being uploaded: a job of a
# thousand small uploads would otherwise wait for each GET and PUT in turn
FILES_IN_FLIGHT = 8


# --- storage: local folders and S3 behind one small interface --------------------------------


class Storage:
    def __init__(self, endpoint_url: str | None = None):
        self.endpoint_url = endpoint_url
        self._s3 = None
        self._lock = threading.Lock()  # boto3 makes clients one thread at a time

    @property
    def s3(self):
        with self._lock:
            return self._s3 or self._client()

    def _client(self):
        import boto3
        from botocore.config import Config

        # objects opened ahead and outputs uploaded in parallel (_transform_files)
        config = Config(max_pool_connections=2 * FILES_IN_FLIGHT + 4)
        self._s3 = boto3.client("s3", endpoint_url=self.endpoint_url, config=config)
        return self._s3

    def list(self, prefix: str) -> list[str]:
        """Object URIs under a prefix (or the one object it names), sorted."""
        if is_s3(prefix):
            bucket, key = split_s3(prefix)
            out = []
            for page in self.s3.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=key
            ):
                out += [f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", [])]
            return sorted(u for u in out if not u.endswith("/"))
        p = Path(prefix)
        if p.is_file():
            return [str(p)]
        if not p.is_dir():
            raise SluiceError(f"input {prefix} does not exist")
        return sorted(str(f) for f in p.rglob("*") if f.is_file() and not f.name.startswith("."))

    def read(self, uri: str) -> bytes:
        with closing(self.open(uri)) as f:
            return f.read()

    def open(self, uri: str) -> BinaryIO:
        """The object as a stream: S3's body is read as it arrives, a file as it is on disk."""
        if is_s3(uri):
            bucket, key = split_s3(uri)
            return self.s3.get_object(Bucket=bucket, Key=key)["Body"]
        return open(uri, "rb")

    def write(self, uri: str, data: bytes) -> None:
        if is_s3(uri):
            bucket, key = split_s3(uri)
            self.s3.put_object(Bucket=bucket, Key=key, Body=data)
            return
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
        Path(uri).write_bytes(data)

    def put_file(self, path: Path, uri: str) -> None:
        """Move a finished local file to `uri` (to S3 in parts when it is big, as the CLI does)."""
        if is_s3(uri):
            bucket, key = split_s3(uri)
            self.s3.upload_file(str(path), bucket, key)
            return
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, uri)


def join(prefix: str, rel: str) -> str:
    return prefix.rstrip("/") + "/" + rel if is_s3(prefix) else str(Path(prefix) / rel)


def resolve_inputs(storage: Storage, uri: str, manifest: bool) -> list[tuple[str, str]]:
    """(object URI, path relative to the input prefix) for every input object."""
    if manifest:
        # [{"prefix": "s3://bucket/prefix/"}, "relative/key1", "relative/key2", ...]
        try:
            doc = json.loads(storage.read(uri))
            prefix = doc[0]["prefix"]
            keys = doc[1:]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise SluiceError(f"manifest {uri} is not a SageMaker manifest file: {e}") from None
        return [(join(prefix, k), k) for k in keys]
    objects = storage.list(uri)
    if not objects:
        raise SluiceError(f"no input objects under {uri}")
    # outputs keep the path below the prefix's last "/" (a folder, for local inputs)
    if is_s3(uri):
        base = uri[: uri.rfind("/") + 1]
    else:
        base = str(Path(uri) if Path(uri).is_dir() else Path(uri).parent)
    return [(o, o[len(base) :].lstrip("/")) for o in objects]


# --- the job --------------------------------------------------------------------------------------


@dataclass
class TransformConfig:
    content_type: str = "application/jsonlines"
    accept: str = "application/jsonlines"
    split_type: str = "Line"
    strategy: str | None = None  # MultiRecord | SingleRecord; None: ask the container
    max_payload_mb: int | None = None
    concurrency: int | None = None
    assemble_with: str = "Line"
    join_source: str = "None"
    max_retries: int = 3
    timeout_s: int = 600
    compression: str = "None"  # Gzip: each object is gunzipped before it is split
    capture_uri: str | None = None  # DataCaptureConfig.DestinationS3Uri (batch capture manifests)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class FileResult:
    uri: str
    output: str | None = None
    records: int = 0
    error_lines: int = 0
    failure: str | None = None


def read_lines(stream: BinaryIO, max_line: int, chunk: int = 2**20) -> Iterator[bytes]:
    """Lines without their terminators, `chunk` bytes read at a time (split_lines on a stream):
    a line longer than `max_line` fails at once instead of filling memory."""
    rest = b""
    while block := stream.read(chunk):
        lines = (rest + block).split(b"\n")
        rest = lines.pop()
        if len(rest) > max_line:
            raise SluiceError(f"a record of more than {max_line} bytes exceeds MaxPayloadInMB")
        for line in lines:
            yield line[:-1] if line.endswith(b"\r") else line
    if rest:
        yield rest[:-1] if rest.endswith(b"\r") else rest


def payloads(stream: BinaryIO, cfg: TransformConfig, limit: int) -> Iterator[bytes]:
    """Split one object into request bodies as Batch Transform does, reading it as it goes."""
    if cfg.split_type == "None":
        body = stream.read(limit + 1)
        if len(body) > limit:
            raise SluiceError(
                f"object of more than {limit} bytes exceeds MaxPayloadInMB with SplitType=None"
            )
        yield body
        return
    lines = read_lines(stream, limit)
    if cfg.strategy == "SingleRecord":
        yield from lines
        return
    current, size = [], 0
    for line in lines:
        if len(line) + 1 > limit:
            raise SluiceError(f"a record of {len(line)} bytes exceeds MaxPayloadInMB")
        if current and size + len(line) + 1 > limit:
            yield b"\n".join(current)
            current, size = [], 0
        current.append(line)
        size += len(line) + 1
    if current:
        yield b"\n".join(current)


class Gunzip(io.RawIOBase):
    """CompressionType=Gzip: an object decompressed as it is read; not gzip: the file's error."""

    def __init__(self, raw: BinaryIO, uri: str):
        self.gz, self.uri = gzip.GzipFile(fileobj=raw), uri

    def read(self, n: int = -1) -> bytes:
        try:
            return self.gz.read(n)
        except (OSError, EOFError, zlib.error) as e:
            raise SluiceError(f"{self.uri} is not gzip (CompressionType=Gzip): {e}") from None


def capture_manifests(
    storage: Storage,
    capture_uri: str,
    inputs: list[tuple[str, str]],
    results: list[FileResult],
    output_uri: str,
) -> None:
    """Batch data capture as SageMaker writes it: manifests of the job's input objects and of
    its outputs (not copies) under <capture>/input/ and <capture>/output/, by hour."""
    import uuid
    from datetime import UTC, datetime

    hour = datetime.now(UTC).strftime("%Y/%m/%d/%H")
    name = f"{uuid.uuid4()}.json"
    base = capture_uri.rstrip("/")
    in_prefix = inputs[0][0][: len(inputs[0][0]) - len(inputs[0][1])] if inputs else ""
    docs = {
        "input": [{"prefix": in_prefix}, *[rel for _, rel in inputs]],
        "output": [
            {"prefix": output_uri.rstrip("/") + "/"},
            *[rel + ".out" for (_, rel), r in zip(inputs, results, strict=True) if r.output],
        ],
    }
    for kind, doc in docs.items():
        storage.write(f"{base}/{kind}/{hour}/{name}", json.dumps(doc).encode())


def join_input(inputs: list[bytes], outputs: list[bytes], content_type: str) -> list[bytes]:
    """JoinSource=Input: JSON inputs get the result under SageMakerOutput, others `input,output`."""
    if len(inputs) != len(outputs):
        raise SluiceError(
            f"JoinSource=Input needs one output line per input line ({len(inputs)} in, "
            f"{len(outputs)} out)"
        )
    joined = []
    for i, o in zip(inputs, outputs, strict=True):
        if "json" in content_type:
            try:
                obj = json.loads(i)
                if isinstance(obj, dict):
                    obj["SageMakerOutput"] = json.loads(o)
                    joined.append(json.dumps(obj, ensure_ascii=False).encode())
                    continue
            except ValueError:
                pass
        joined.append(i + b"," + o)
    return joined


class Container:
    """A serving container at `url` that SageMaker's contract reaches: /ping,
    /execution-parameters, /invocations."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def wait_ready(self, timeout: float = 240) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            self._check_alive()
            try:
                with urllib.request.urlopen(self.url + "/ping", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise SluiceError(f"the container at {self.url} did not pass /ping within {timeout:.0f} s")

    def _check_alive(self) -> None:
        """Raise if the container is known to have stopped (here: nothing is known)."""

    def stop(self) -> None:
        """Nothing to stop: the container is someone else's."""

    def execution_parameters(self) -> dict:
        try:
            with urllib.request.urlopen(self.url + "/execution-parameters", timeout=5) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError:
            return {}

    def invoke(self, body: bytes, cfg: TransformConfig) -> bytes:
        req = urllib.request.Request(
            self.url + "/invocations",
            data=body,
            method="POST",
            headers={"Content-Type": cfg.content_type, "Accept": cfg.accept},
        )
        last = None
        for attempt in range(cfg.max_retries + 1):
            try:
                with urllib.request.urlopen(req, timeout=cfg.timeout_s) as r:
                    return r.read()
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read().decode(errors='replace')[:500]}"
                if e.code < 500:
                    break  # a 4xx will not change on retry
            except (urllib.error.URLError, ConnectionError, TimeoutError, HTTPException) as e:
                # HTTPException: e.g. IncompleteRead, a response cut mid-stream
                last = f"{type(e).__name__}: {e}"
            log.warning("invocation attempt %d failed: %s", attempt + 1, last)
        raise SluiceError(f"invocation failed: {last}")


class ServeProcess(Container):
    """The real `sluice serve` in a subprocess on a free port, as SageMaker starts the image."""

    def __init__(
        self,
        model_dir: Path,
        env: dict[str, str],
        log_path: Path | None = None,
        base_env: dict[str, str] | None = None,
    ):
        """`env` over `base_env` (default: this process's environment); output to `log_path`."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        super().__init__(f"http://127.0.0.1:{self.port}")
        base = os.environ if base_env is None else base_env
        full_env = {**base, "SAGEMAKER_BIND_TO_PORT": str(self.port), **env}
        log = open(log_path, "ab") if log_path else None  # noqa: SIM115 (the child owns it)
        # killed with whoever started it (the stack, or a transform driver), even by kill -9
        cmd = [sys.executable, "-m", "sluice.cli", "serve", "--model-dir", str(model_dir)]
        self.proc = processes.popen(
            [*cmd, "--host", "127.0.0.1"],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT if log else None,
        )
        if log:
            log.close()

    def _check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise SluiceError(f"the serve process exited with {self.proc.returncode}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the group: serve and vLLM's processes
        processes.untrack(self.proc.pid)


def run_transform(
    model_dir: Path | None,
    input_uri: str,
    output_uri: str,
    cfg: TransformConfig,
    manifest: bool = False,
    endpoint_url: str | None = None,
    progress: bool = False,
    container_url: str | None = None,
) -> dict:
    """Run the job; returns a summary like a DescribeTransformJob plus per-file counts.

    The job starts its own `sluice serve` on `model_dir` with `cfg.env`, as SageMaker starts the
    image for each job, or, given `container_url`, uses a container that already serves (its
    model and environment are the ones it was started with)."""
    if (model_dir is None) == (container_url is None):
        raise SluiceError("give either a model folder or the URL of a serving container")
    if container_url and cfg.env:
        raise SluiceError("a running container keeps the environment it was started with")
    storage = Storage(endpoint_url)
    inputs = resolve_inputs(storage, input_uri, manifest)
    t0 = time.monotonic()
    env = {"SAGEMAKER_BATCH": "true", **cfg.env}
    server = Container(container_url) if container_url else ServeProcess(model_dir, env)
    try:
        server.wait_ready()
        asked = server.execution_parameters()
        strategy = cfg.strategy or {"SINGLE_RECORD": "SingleRecord"}.get(
            asked.get("BatchStrategy", ""), "MultiRecord"
        )
        payload_mb = cfg.max_payload_mb or int(asked.get("MaxPayloadInMB", 6))
        concurrency = cfg.concurrency or int(asked.get("MaxConcurrentTransforms", 1))
        if payload_mb * concurrency > 100:
            raise SluiceError("MaxConcurrentTransforms x MaxPayloadInMB must be at most 100")
        cfg = TransformConfig(**{**cfg.__dict__, "strategy": strategy})
        log.info(
            "transform: %d objects, %s, MaxPayloadInMB=%d, MaxConcurrentTransforms=%d",
            len(inputs),
            strategy,
            payload_mb,
            concurrency,
        )
        results = _transform_files(
            storage, server, inputs, output_uri, cfg, payload_mb, concurrency, progress
        )
    finally:
        server.stop()
    if cfg.capture_uri:
        capture_manifests(storage, cfg.capture_uri, inputs, results, output_uri)
    failed = [r for r in results if r.failure]
    return {
        "TransformJobStatus": "Failed" if failed else "Completed",
        "FailureReason": "; ".join(f"{r.uri}: {r.failure}" for r in failed)[:1024] or None,
        "BatchStrategy": strategy,
        "MaxPayloadInMB": payload_mb,
        "MaxConcurrentTransforms": concurrency,
        "input": input_uri,
        "output": output_uri,
        "files": [r.__dict__ for r in results],
        "records": sum(r.records for r in results),
        "error_lines": sum(r.error_lines for r in results),
        "duration_s": round(time.monotonic() - t0, 3),
    }


def _transform_files(storage, server, inputs, output_uri, cfg, payload_mb, concurrency, progress):
    """Stream every object through the container, as SageMaker does with big objects: payloads
    are read at most 2 x MaxConcurrentTransforms ahead of the answers, and each output is
    written as its answers come back, in order, to a spool file that becomes the `.out` once
    the whole object succeeded. Memory is bounded by the payloads in flight, not the files."""
    limit = payload_mb * 2**20
    results = [FileResult(uri) for uri, _ in inputs]

    def plan() -> Iterator[tuple[int, bytes | None]]:  # (file, payload); None: the file's end
        with ThreadPoolExecutor(FILES_IN_FLIGHT) as opener:
            ahead: deque = deque()
            upcoming = iter(enumerate(inputs))
            for i, (uri, _) in itertools.islice(upcoming, FILES_IN_FLIGHT):
                ahead.append((i, uri, opener.submit(storage.open, uri)))
            while ahead:
                i, uri, opened = ahead.popleft()
                for j, (later, _) in itertools.islice(upcoming, 1):
                    ahead.append((j, later, opener.submit(storage.open, later)))
                try:
                    with closing(opened.result()) as raw:
                        stream = Gunzip(raw, uri) if cfg.compression == "Gzip" else raw
                        for body in payloads(stream, cfg, limit):
                            yield i, body
                except SluiceError as e:
                    results[i].failure = str(e)
                yield i, None

    def invoke(body: bytes) -> bytes:
        try:
            return server.invoke(body, cfg)
        except SluiceError:
            raise
        except Exception as e:  # this file fails, with the reason; the other files go on
            raise SluiceError(f"{e!r}") from None

    def put(spool: Path, uri: str) -> str:
        try:
            storage.put_file(spool, uri)
        finally:
            spool.unlink(missing_ok=True)
        return uri

    spools: dict[int, io.BufferedWriter] = {}
    window: deque[tuple[int, bytes | None, Future | None]] = deque()
    uploads: list[tuple[FileResult, Future]] = []
    with (
        tempfile.TemporaryDirectory(prefix="sluice-transform-") as tmp,
        ThreadPoolExecutor(max_workers=concurrency) as pool,
        ThreadPoolExecutor(max_workers=FILES_IN_FLIGHT) as uploader,
        tqdm(unit="request", disable=not progress) as bar,
    ):

        def settle() -> None:  # the oldest payload in flight: its answer into its file's spool
            i, body, future = window.popleft()
            r = results[i]
            if future is None:  # the file's end: its spool becomes its output, or goes
                spools[i].close()
                spool = Path(spools.pop(i).name)
                if r.failure:
                    spool.unlink(missing_ok=True)
                else:
                    uploads.append(
                        (r, uploader.submit(put, spool, join(output_uri, inputs[i][1] + ".out")))
                    )
                return
            bar.update()
            try:
                answer = future.result()
                if r.failure:
                    return
                lines = list(split_lines(answer))
                r.records += len(lines)
                r.error_lines += sum(
                    1 for ln in lines if ln.startswith(b"{") and b'"error":{' in ln
                )
                if cfg.join_source == "Input":
                    answer = b"\n".join(
                        join_input(list(split_lines(body)), lines, cfg.content_type)
                    )
            except SluiceError as e:
                r.failure = r.failure or str(e)
                return
            spools[i].write(answer + (b"\n" if cfg.assemble_with == "Line" else b""))

        for i, body in plan():
            if i not in spools:
                spools[i] = open(Path(tmp) / f"{i}.out", "wb")  # noqa: SIM115 (closed in settle)
            window.append((i, body, None if body is None else pool.submit(invoke, body)))
            while len(window) > 2 * concurrency:
                settle()
        while window:
            settle()
        for r, done in uploads:
            try:
                r.output = done.result()
            except Exception as e:  # the output could not be written: its file fails
                r.failure = f"writing its output: {e!r}"
    return results
