"""What survive-a-crash costs the local stack: `sluice-local up --durability acknowledged`
(a change is on disk before it is answered) vs `periodic` (a snapshot every 10 s, as before).

Each round starts a fresh stack in each mode (alternating), then measures, as a user's client
sees it over HTTP:
- a burst: `--uploads` PUTs of small prompt files under incoming/, `--threads` at a time
  (uploads/s until the last is acknowledged, and each PUT's latency);
- sequential calls, one at a time: S3 PutObject, SQS SendMessage, DynamoDB PutItem (the cost per
  request: acknowledged - periodic);
- the snapshot itself (the state at the end of the round: size on disk, and how long one takes).
Without `--model`, uploads end as start_transform's "no model yet" reports and the measure is
the local AWS APIs; with a model folder, also the seconds until a transform job has answered the
whole burst (its _SUCCESS.json), as a user waits for it.

    python -m benchmarks.local_durability [--rounds 3] [--uploads 60] [--threads 8]
        [--from-state sluice-demo/local]   # a state that has lived a while
        [--model DIR]                      # end to end, through a transform job
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
from botocore.config import Config


def start(state: Path, mode: str, *extra: str) -> tuple[subprocess.Popen, dict]:
    """A fresh `sluice-local up` on `state` (any port); its process and its ready file."""
    ready = state / "ready.json"
    ready.unlink(missing_ok=True)  # a copied state's (--from-state) names a stopped stack
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sluice_local.cli",
            "up",
            "--state",
            str(state),
            "--port",
            "0",
            "--durability",
            mode,
            "--ready-file",
            str(ready),
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
    )
    deadline = time.monotonic() + 180
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"sluice-local up ({mode}) did not start")
        time.sleep(0.2)
    return proc, json.loads(ready.read_text())


def clients(endpoint: str, service: str | None = None):
    """boto3 clients on the local endpoint: one `service`, or S3, SQS and DynamoDB by name."""
    cfg = Config(retries={"max_attempts": 1}, max_pool_connections=32)
    kw = dict(
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
        config=cfg,
    )
    if service:
        return boto3.client(service, **kw)
    return {s: boto3.client(s, **kw) for s in ("s3", "sqs", "dynamodb")}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def one_round(mode: str, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        if args.from_state:  # a stack that has lived a while (e.g. sluice-demo/local)
            shutil.copytree(args.from_state, state, ignore=shutil.ignore_patterns("*.log"))
            (state / "processes.json").unlink(missing_ok=True)
        else:
            state.mkdir()
        proc, status = start(state, mode)
        try:
            c = clients(status["endpoint"])
            bucket = status["outputs"]["DataBucketName"]
            body = b'{"text": "the cat sat on the"}\n' * 3

            def put(i: int) -> float:
                key = f"incoming/bench/{mode}-{i:04d}.jsonl"
                return timed(lambda: c["s3"].put_object(Bucket=bucket, Key=key, Body=body))

            users = None
            if args.model:  # end to end: the burst answered by a transform job and its report
                from sluice_local.demo import Users

                endpoint = status["endpoint"]
                users = Users(lambda svc: clients(endpoint, svc), status["outputs"], state)
                users.use_model(args.model, "sluice-bench-model")
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.threads) as pool:
                burst = list(pool.map(put, range(args.uploads)))
            burst_s = time.perf_counter() - t0
            answered = {}
            if users is not None:
                keys = [f"incoming/bench/{mode}-{i:04d}.jsonl" for i in range(args.uploads)]
                users.wait_for_reports(keys)
                answered = {"answered_s": time.perf_counter() - t0}
            time.sleep(2)  # let the pollers take the burst before the sequential calls
            url = c["sqs"].create_queue(QueueName="bench")["QueueUrl"]
            table = "sluice-local-claims"
            seq = {
                "s3_put": [put(10_000 + i) for i in range(args.calls)],
                "sqs_send": [
                    timed(lambda: c["sqs"].send_message(QueueUrl=url, MessageBody="x"))
                    for _ in range(args.calls)
                ],
                "ddb_put": [
                    timed(
                        lambda i=i: c["dynamodb"].put_item(
                            TableName=table,
                            Item={"object": {"S": f"bench-{i}"}, "job": {"S": "bench"}},
                        )
                    )
                    for i in range(args.calls)
                ],
            }
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
        snap = _snapshot_cost(state)
    return {
        "mode": mode,
        "burst_uploads_per_s": args.uploads / burst_s,
        "burst_p50_ms": statistics.median(burst),
        "burst_max_ms": max(burst),
        **answered,
        **{f"{k}_p50_ms": statistics.median(v) for k, v in seq.items()},
        **snap,
    }


def _snapshot_cost(state: Path) -> dict:
    """Load the round's final state and time one snapshot of it (in a fresh process)."""
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.local_durability", "--snapshot-of", str(state)],
        capture_output=True,
        text=True,
        check=True,
    )
    # its last JSON line: what the restored services print on the way is not ours to parse
    return json.loads(next(x for x in reversed(out.stdout.splitlines()) if x.startswith("{")))


def snapshot_of(state: Path) -> dict:
    """Snapshot sizes and times of a state: all services, and what one more upload writes (its
    key and the message its notification sent: what the gateway marks for a plain PutObject)."""
    from moto.s3.models import s3_backends

    from sluice_local import moto_fixes, persist

    moto_fixes.apply()
    persist.restore(state / "moto")
    store = persist.Store(state / "moto")
    s3 = next(b for regions in s3_backends.values() for b in regions.values() if b.buckets)
    bucket = next((n for n in s3.buckets if "-data-" in n), next(iter(s3.buckets)))
    out = {}
    for label in ("all", "upload"):
        took = []
        for i in range(5):
            names = persist.SERVICES
            if label == "upload":
                s3.put_object(bucket, f"incoming/bench/snapshot-{i}.jsonl", b'{"text": "x"}\n')
                names = {persist.KEYS, persist.MESSAGES}
            t0 = time.perf_counter()
            size = store.write(names)
            took.append(time.perf_counter() - t0)
        out[f"snapshot_{label}_bytes"] = size
        out[f"snapshot_{label}_ms"] = statistics.median(took) * 1000
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--uploads", type=int, default=60)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--calls", type=int, default=40, help="sequential calls of each kind")
    ap.add_argument("--out", default="benchmarks/results/local_durability.json")
    ap.add_argument("--from-state", type=Path, help="start each stack from a copy of this state")
    ap.add_argument(
        "--model", type=Path, help="a model folder: also time the burst until a job answered it"
    )
    ap.add_argument("--snapshot-of", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.snapshot_of:
        print(json.dumps(snapshot_of(args.snapshot_of)))
        return
    runs = []
    for r in range(args.rounds):
        for mode in ("periodic", "acknowledged") if r % 2 == 0 else ("acknowledged", "periodic"):
            runs.append(one_round(mode, args))
            print(json.dumps(runs[-1]), flush=True)
    summary = {}
    for mode in ("periodic", "acknowledged"):
        mine = [x for x in runs if x["mode"] == mode]
        summary[mode] = {k: statistics.median(x[k] for x in mine) for k in mine[0] if k != "mode"}
    a, p = summary["acknowledged"], summary["periodic"]
    summary["ratios"] = {
        "burst_throughput_acknowledged_over_periodic": a["burst_uploads_per_s"]
        / p["burst_uploads_per_s"],
        **(
            {"answered_time_acknowledged_over_periodic": a["answered_s"] / p["answered_s"]}
            if "answered_s" in a
            else {}
        ),
        **{
            f"{k}_added_ms": a[f"{k}_p50_ms"] - p[f"{k}_p50_ms"]
            for k in ("s3_put", "sqs_send", "ddb_put")
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"args": vars(args), "runs": runs, **summary}, indent=1, default=str)
    )
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
