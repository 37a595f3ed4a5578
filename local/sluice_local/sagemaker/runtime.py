"""What every local job and endpoint shares: S3 transfers, unpacked models, container processes.

A job's container is a process running the Sluice image's own entrypoint (`sluice ...`, the
package installed here) with the environment SageMaker would give it; only the AWS endpoint
variables point at the local stack.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sluice import s3uri
from sluice.errors import SluiceError

from .. import processes
from .shapes import ApiError


def split_s3(uri: str) -> tuple[str, str]:
    """`sluice.s3uri.split_s3`, its error as SageMaker's ValidationException."""
    try:
        return s3uri.split_s3(uri)
    except SluiceError as e:
        raise ApiError("ValidationException", str(e)) from None


@dataclass
class Context:
    """The local SageMaker's surroundings: where things live, how to reach S3, the env."""

    root: Path  # <state>/sagemaker
    endpoint_url: str
    base_env: dict[str, str]  # the environment every container process starts from
    say: Callable[[str, str], None] = lambda category, message: None
    _s3: object = field(default=None, repr=False)

    @property
    def s3(self):
        if self._s3 is None:
            import boto3

            self._s3 = boto3.client("s3", endpoint_url=self.endpoint_url)
        return self._s3

    # --- S3 -------------------------------------------------------------------------------------

    def download(self, uri: str, dest: Path, data_type: str = "S3Prefix") -> int:
        """Objects under an S3 prefix (or listed by a manifest) into `dest`, keeping their
        paths below the prefix, as SageMaker fills a channel or processing input."""
        dest.mkdir(parents=True, exist_ok=True)
        if data_type == "ManifestFile":
            bucket, key = split_s3(uri)
            doc = json.loads(self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            base_bucket, base = split_s3(doc[0]["prefix"])
            pairs = [(base_bucket, base + rel, rel) for rel in doc[1:]]
        elif data_type == "S3Prefix":
            bucket, prefix = split_s3(uri)
            pairs = []
            for page in self.s3.get_paginator("list_objects_v2").paginate(
                Bucket=bucket, Prefix=prefix
            ):
                for obj in page.get("Contents", []):
                    key = obj["Key"]
                    if key.endswith("/"):
                        continue
                    rel = key[len(prefix) :].lstrip("/") or key.rsplit("/", 1)[-1]
                    pairs.append((bucket, key, rel))
        else:
            raise ApiError(
                "ValidationException", f"S3DataType {data_type} is not supported locally"
            )
        for bucket, key, rel in pairs:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            self.s3.download_file(bucket, key, str(target))
        return len(pairs)

    def upload_dir(self, src: Path, uri: str) -> int:
        bucket, prefix = split_s3(uri)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        files = sorted(p for p in src.rglob("*") if p.is_file()) if src.exists() else []
        for path in files:
            self.s3.upload_file(str(path), bucket, prefix + path.relative_to(src).as_posix())
        return len(files)

    def upload_file(self, path: Path, uri: str) -> None:
        bucket, key = split_s3(uri)
        self.s3.upload_file(str(path), bucket, key)

    # --- models ---------------------------------------------------------------------------------

    def model_dir(self, model_data_url: str) -> Path:
        """A model archive unpacked once (by URL and ETag), as /opt/ml/model would hold it."""
        bucket, key = split_s3(model_data_url)
        etag = self.s3.head_object(Bucket=bucket, Key=key)["ETag"].strip('"')
        digest = hashlib.sha256(f"{model_data_url}@{etag}".encode()).hexdigest()[:16]
        out = self.root / "models" / digest
        if (out / ".complete").exists():
            return out
        out.mkdir(parents=True, exist_ok=True)
        archive = out.with_suffix(".tar.gz")
        self.s3.download_file(bucket, key, str(archive))
        with tarfile.open(archive) as tar:
            tar.extractall(out, filter="data")
        archive.unlink()
        (out / ".complete").write_text(model_data_url)
        return out

    # --- processes ------------------------------------------------------------------------------

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {**self.base_env, "PYTHONUNBUFFERED": "1", **(extra or {})}


def primary_container(model: dict) -> dict:
    """A model's container: PrimaryContainer, or the first of Containers."""
    return model.get("PrimaryContainer") or (model.get("Containers") or [{}])[0]


def sluice_command(argv: list[str]) -> list[str]:
    """The Sluice image's entrypoint (`sluice ...`) as a process of this installation."""
    if not argv or Path(argv[0]).name != "sluice":
        raise ApiError(
            "ValidationException",
            f"the local SageMaker runs the Sluice image's `sluice` entrypoint only, not {argv[:1]}",
        )
    return [sys.executable, "-m", "sluice.cli", *argv[1:]]


class Container:
    """One container process: output to its log (the CloudWatch stream), lines to a callback,
    SIGTERM then SIGKILL after `grace_s` to stop it, as SageMaker stops containers."""

    def __init__(
        self,
        cmd: list[str],
        env: dict[str, str],
        log_path: Path,
        on_line: Callable[[str], None] | None = None,
        cwd: Path | None = None,
    ):
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        # its own group (stopped as a whole), killed with the stack, recorded for a restart
        self.proc = processes.popen(
            cmd,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        self.stopped = False
        self._reader = threading.Thread(target=self._read, args=(on_line,), daemon=True)
        self._reader.start()

    def _read(self, on_line) -> None:
        with open(self.log_path, "a", encoding="utf-8") as f:
            for line in self.proc.stdout:
                f.write(line)
                f.flush()
                if on_line is not None:
                    on_line(line.rstrip("\n"))
        self.proc.wait()
        processes.untrack(self.proc.pid)

    def wait(self, timeout_s: float | None = None) -> int:
        """Exit code; past `timeout_s` the container is stopped (and -1 returned)."""
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            rc = -1
        self._reader.join(timeout=10)
        return rc

    def stop(self, grace_s: float = 30) -> None:
        self.stopped = True
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def tar_dir(src: Path, archive: Path) -> Path:
    """model.tar.gz as SageMaker packs /opt/ml/model: the folder's contents at the root."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for p in sorted(src.iterdir()):
            tar.add(p, arcname=p.name)
    return archive


def now() -> float:
    return time.time()
