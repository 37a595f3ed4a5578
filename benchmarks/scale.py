"""At scale: many small uploads into a local stack whose account may run few transform instances.

A fresh `sluice-local up` (template.yaml as deployed, acknowledged durability) with a SageMaker
quota of `--quota` instances for transform jobs of the template's instance type, a tiny model
brought as docs/batch.md says, then `--uploads` one-record files PUT by `--threads` clients, as
fast as the stack answers. It waits until every upload is covered by a job's report and checks:
each upload is in exactly one report with exactly one output of one line, nothing in any
dead-letter queue, never more transform jobs running than the quota, and the number of jobs
against the coalescing rules (at least uploads / MaxFilesPerJob). It measures the time from the
first upload to the last report, uploads/s as the clients saw them, and the peak memory of the
stack's own process and of all its processes (the jobs' serving containers included), sampled
every second.

    python -m benchmarks.scale [--uploads 10000] [--quota 2] [--threads 8]
        [--window 60] [--model DIR]  # without --model, a tiny GPT-2 is trained first (~30 s)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from benchmarks.local_durability import clients, start

INSTANCE_TYPE = "ml.g5.xlarge"  # template.yaml's TransformInstanceType default


def train_tiny(out: Path) -> Path:
    from sluice_local.corpus import write_corpus

    write_corpus(out / "data" / "corpus.txt", 2000, seed=1)
    sets = {"model_size": "tiny", "max_steps": 60, "vocab_size": 384, "block_size": 32}
    cmd = [sys.executable, "-m", "sluice.cli", "train", "--train", str(out / "data")]
    cmd += ["--output", str(out / "job")]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    subprocess.run(cmd, check=True, capture_output=True)
    return out / "job" / "model"


def rss_parts(pid: int) -> dict[str, int]:
    """A process's RSS by kind, in bytes (Linux's /proc/PID/status): anonymous memory (Python's
    heap), file pages (mapped files: the stack's log) and shared memory."""
    parts = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem"):
                parts[key] = int(value.split()[0]) * 1024
    return parts


class Memory:
    """Peak RSS of a process (`peak_stack`, and what it was made of then: `peak_parts`) and of it
    with all its descendants (`peak_all`), sampled every `interval` seconds until `done` is set."""

    def __init__(self, pid: int, interval: float = 1.0):
        self.proc, self.interval = psutil.Process(pid), interval
        self.peak_stack = self.peak_all = 0
        self.peak_parts: dict[str, int] = {}
        self.done = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self.done.wait(self.interval):
            try:
                own = self.proc.memory_info().rss
                kids = 0
                for c in self.proc.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        kids += c.memory_info().rss
            except psutil.Error:
                return
            if own > self.peak_stack:
                self.peak_stack, self.peak_parts = own, rss_parts(self.proc.pid)
            self.peak_all = max(self.peak_all, own + kids)


def reports(s3, bucket: str, seen: dict[str, dict]) -> None:
    """Read the reports of job folders not yet seen (one listing by folder, not by object)."""
    pages = s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix="outputs/", Delimiter="/"
    )
    for page in pages:
        for p in page.get("CommonPrefixes", []):
            folder = p["Prefix"]
            if folder in seen:
                continue
            for name in ("_SUCCESS.json", "_FAILURE.json"):
                try:
                    body = s3.get_object(Bucket=bucket, Key=folder + name)["Body"].read()
                except s3.exceptions.NoSuchKey:
                    continue
                seen[folder] = json.loads(body)


def most_at_once(jobs: list[dict]) -> int:
    """The most transform jobs whose [CreationTime, TransformEndTime] overlap."""
    edges = sorted(
        [(j["CreationTime"], 1) for j in jobs] + [(j["TransformEndTime"], -1) for j in jobs],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    now = peak = 0
    for _, d in edges:
        now += d
        peak = max(peak, now)
    return peak


def run(args, model: Path, state: Path) -> dict:
    quota = f"{INSTANCE_TYPE} for transform job usage={args.quota}"
    proc, status = start(
        state, "acknowledged", "--quota", quota,
        "--parameter-overrides", f"BatchingWindowSeconds={args.window}",
    )  # fmt: skip
    mem = Memory(proc.pid)
    try:
        from sluice_local.demo import Users

        endpoint, outputs = status["endpoint"], status["outputs"]
        users = Users(lambda svc: clients(endpoint, svc), outputs, state)
        users.use_model(model, "sluice-scale-model")
        s3, bucket = clients(endpoint, "s3"), outputs["DataBucketName"]
        keys = [f"incoming/scale/{i // 1000:03d}/{i:06d}.jsonl" for i in range(args.uploads)]

        def put(i: int) -> None:
            rec = {"id": i, "text": "The lazy cat eats", "parameters": {"max_new_tokens": 1}}
            s3.put_object(Bucket=bucket, Key=keys[i], Body=json.dumps(rec).encode() + b"\n")

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.threads) as pool:
            for n, _ in enumerate(pool.map(put, range(args.uploads)), 1):
                if n % 1000 == 0:
                    print(f"  {n} uploads, {n / (time.perf_counter() - t0):.1f}/s", flush=True)
        upload_s = time.perf_counter() - t0
        seen: dict[str, dict] = {}
        wanted = {f"s3://{bucket}/{k}" for k in keys}
        covered = 0
        last_progress = time.perf_counter()
        while covered < len(wanted):
            time.sleep(5)
            before = len(seen)
            reports(s3, bucket, seen)
            covered = len(wanted & {i for d in seen.values() for i in d.get("inputs", [])})
            if len(seen) > before:
                last_progress = time.perf_counter()
                print(f"  {len(seen)} reports, {covered} uploads covered", flush=True)
            if time.perf_counter() - last_progress > args.stall_s:
                raise SystemExit(f"no report for {args.stall_s} s; {covered} covered; {state}")
        done_s = time.perf_counter() - t0
        return {
            **check(args, users, seen, wanted, outputs),
            "uploads": args.uploads,
            "quota": args.quota,
            "window_s": args.window,
            "upload_s": round(upload_s, 1),
            "uploads_per_s": round(args.uploads / upload_s, 1),
            "first_upload_to_last_report_s": round(done_s, 1),
            "stack_peak_rss_mb": round(mem.peak_stack / 2**20),
            # at that peak: Python's heap (RssAnon) vs the mapped log's pages (RssFile)
            "stack_peak_rss_parts_mb": {k: round(v / 2**20) for k, v in mem.peak_parts.items()},
            "all_processes_peak_rss_mb": round(mem.peak_all / 2**20),
        }
    finally:
        mem.done.set()
        proc.terminate()
        proc.wait(timeout=120)


def check(args, users, seen: dict[str, dict], wanted: set[str], outputs: dict) -> dict:
    """What must hold at any scale; the counts that show it."""
    per_input: dict[str, int] = {}
    for doc in seen.values():
        for i in doc.get("inputs", []):
            per_input[i] = per_input.get(i, 0) + 1
    twice = sum(1 for n in per_input.values() if n > 1)
    outs = [o for d in seen.values() for o in d.get("outputs", [])]
    one_line = sum(1 for o in outs if o.get("records") == 1 and o.get("input") in wanted)
    sm = users.client("sagemaker")
    jobs = [
        sm.describe_transform_job(TransformJobName=j["TransformJobName"])
        for page in sm.get_paginator("list_transform_jobs").paginate()
        for j in page["TransformJobSummaries"]
    ]
    sqs = users.client("sqs")
    dead = 0
    for name, url in outputs.items():
        if name.endswith("DeadLetterQueueUrl"):
            a = sqs.get_queue_attributes(
                QueueUrl=url,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                ],
            )["Attributes"]
            dead += sum(int(v) for v in a.values())
    failed = [d for d in seen.values() if d.get("status") != "Completed"]
    result = {
        "jobs": len(jobs),
        "jobs_failed": sum(1 for j in jobs if j["TransformJobStatus"] != "Completed"),
        "reports": len(seen),
        "reports_not_completed": len(failed),
        "uploads_in_two_reports": twice,
        "outputs_of_one_line": one_line,
        "dead_letters": dead,
        "most_jobs_at_once": most_at_once([j for j in jobs if "TransformEndTime" in j]),
    }
    ok = (
        not twice
        and not failed
        and one_line == len(wanted)
        and dead == 0
        and result["most_jobs_at_once"] <= args.quota
        and len(jobs) >= -(-len(wanted) // 1000)  # MaxFilesPerJob's default
    )
    result["all_checks_pass"] = ok
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uploads", type=int, default=10_000)
    ap.add_argument("--quota", type=int, default=2, help="transform instances the account may run")
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--window", type=int, default=60, help="BatchingWindowSeconds (template's)")
    ap.add_argument("--stall-s", type=int, default=900, help="give up after this long idle")
    ap.add_argument("--model", type=Path, help="a model folder (default: train a tiny one)")
    ap.add_argument("--out", default="benchmarks/results/scale-{uploads}.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or train_tiny(Path(tmp) / "model")
        state = Path(tmp) / "state"
        state.mkdir()
        result = run(args, model, state)
    print(json.dumps(result, indent=2))
    out = Path(args.out.format(uploads=args.uploads))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if not result["all_checks_pass"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
