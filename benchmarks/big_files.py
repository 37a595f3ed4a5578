"""Big input files through `sluice-local transform` (the local SageMaker's transform jobs run it):
memory bounded by the payloads in flight, not by the file.

For each size, one JSON Lines file of that many GB, split by line into MaxPayloadInMB payloads,
goes to a container that answers each request with its own body (SageMaker's container contract
over HTTP, no model: this measures the driver, and the engine's records/s are measured
elsewhere). Read from a local folder, and from S3 (a moto server, as the local stack's S3 is)
for the sizes in `--s3-gb`. Reports the driver's peak RSS (its own rusage), MB/s, that the
output equals the input, and the S3 server's peak RSS (the emulator keeps objects it serves).

    python -m benchmarks.big_files [--gb 1 5] [--s3-gb 1] [--payload-mb 6]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.scale import Memory
from tests.helpers import EchoContainer, free_port, peak_rss_mb

LINE = json.dumps({"text": "The lazy cat eats the fish that the dog left " * 2}).encode() + b"\n"


def write_file(path: Path, gb: float) -> str:
    """A JSON Lines file of `gb` GB; its sha256."""
    block = LINE * (2**20 // len(LINE))
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(int(gb * 1024)):
            f.write(block)
            digest.update(block)
    return digest.hexdigest()


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(2**24):
            digest.update(block)
    return digest.hexdigest()


def transform(url: str, src: str, out: str, payload_mb: int, env=None) -> dict:
    cmd = [sys.executable, "-m", "sluice_local.cli", "transform", "--container-url", url]
    cmd += ["--input", src, "--output", out, "--max-payload-mb", str(payload_mb)]
    summary = Path(tempfile.mkdtemp()) / "summary.json"
    t0 = time.perf_counter()
    rss = peak_rss_mb([*cmd, "--summary", str(summary)], env=env)
    took = time.perf_counter() - t0
    doc = json.loads(summary.read_text())
    assert doc["TransformJobStatus"] == "Completed", doc
    return {"seconds": round(took, 1), "driver_peak_rss_mb": round(rss), "records": doc["records"]}


def row(source: str, gb: float, got: dict, same: bool, **extra) -> dict:
    mb_per_s = round(gb * 1024 / got["seconds"])
    return {"source": source, "gb": gb, **got, "mb_per_s": mb_per_s, "same": same, **extra}


def local_run(gb: float, url: str, payload_mb: int, tmp: Path) -> dict:
    src, out = tmp / f"in-{gb}", tmp / f"out-{gb}"
    src.mkdir()
    digest = write_file(src / "big.jsonl", gb)
    got = transform(url, str(src), str(out), payload_mb)
    same = sha256(out / "big.jsonl.out") == digest
    for p in (src / "big.jsonl", out / "big.jsonl.out"):
        p.unlink()
    return row("local", gb, got, same)


def s3_run(gb: float, url: str, payload_mb: int, tmp: Path) -> dict:
    import boto3

    port = free_port()
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "x",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                s3 = boto3.client(
                    "s3",
                    endpoint_url=endpoint,
                    region_name="us-east-1",
                    aws_access_key_id="x",
                    aws_secret_access_key="x",
                )
                s3.create_bucket(Bucket="big")
                break
            except Exception:
                time.sleep(0.2)
        path = tmp / "s3-in.jsonl"
        digest = write_file(path, gb)
        s3.upload_file(str(path), "big", "in/big.jsonl")
        path.unlink()
        rss = Memory(server.pid, interval=0.5)
        got = transform(
            url,
            "s3://big/in/",
            "s3://big/out/",
            payload_mb,
            env={**env, "AWS_ENDPOINT_URL": endpoint},
        )
        rss.done.set()
        s3.download_file("big", "out/big.jsonl.out", str(path))
        same = sha256(path) == digest
        path.unlink()
    finally:
        server.terminate()
        server.wait(timeout=60)
    return row(
        "s3 (moto server)", gb, got, same, s3_server_peak_rss_mb=round(rss.peak_stack / 2**20)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, nargs="*", default=[1, 5])
    ap.add_argument("--s3-gb", type=float, nargs="*", default=[1])
    ap.add_argument("--payload-mb", type=int, default=6)
    ap.add_argument("--out", default="benchmarks/results/big_files.json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, EchoContainer(args.payload_mb) as url:
        for gb in args.gb:
            rows.append(local_run(gb, url, args.payload_mb, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
        for gb in args.s3_gb:
            rows.append(s3_run(gb, url, args.payload_mb, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
