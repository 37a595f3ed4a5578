"""`sluice-local transform`: Batch Transform semantics against the real serve and moto's S3."""

from __future__ import annotations

import json
import sys

import boto3
import pytest

from sluice.errors import SluiceError
from tests.helpers import (
    AWS_TEST_ENV,
    FIGURES,
    EchoContainer,
    MotoServer,
    Server,
    peak_rss_mb,
    run_local,
)

AWS_ENV = AWS_TEST_ENV


@pytest.fixture(scope="module")
def s3_endpoint(monkeypatch_module):
    server = MotoServer()
    for k, v in AWS_ENV.items():
        monkeypatch_module.setenv(k, v)
    yield server.env["AWS_ENDPOINT_URL"]
    server.stop()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


@pytest.fixture(scope="module")
def container(trained):
    """One serving container (`--container-url`) for the jobs here that only read from it.
    SageMaker starts the image for each job, and the failing-file test keeps that start
    (`--model`); the others would each wait ~45 s for it."""
    s = Server(trained["model"], SAGEMAKER_BATCH="true", SLUICE_BATCH_WAIT_MS="1")
    yield s.url
    s.stop()


def test_a_running_container_keeps_its_own_environment():
    from sluice_local.transform import TransformConfig, run_transform

    with pytest.raises(SluiceError, match="environment it was started with"):
        run_transform(None, "in", "out", TransformConfig(env={"A": "1"}), container_url="http://x")
    with pytest.raises(SluiceError, match="either a model folder or the URL"):
        run_transform(None, "in", "out", TransformConfig())


def jsonl(records) -> bytes:
    return ("\n".join(json.dumps(r) for r in records) + "\n").encode()


def test_s3_prefix_with_manifest_multi_record_and_join(container, s3_endpoint):
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="data")
    files = {
        "incoming/a b/ünï.jsonl": jsonl([{"id": i, "text": f"The cat {i}"} for i in range(30)]),
        "incoming/b.jsonl": jsonl([{"id": "x", "text": "In the desert", "task": "score"}, 42]),
        "incoming/c.jsonl": jsonl([{"id": "skip", "text": "not in the manifest"}]),
    }
    for key, body in files.items():
        s3.put_object(Bucket="data", Key=key, Body=body)
    manifest = [{"prefix": "s3://data/incoming/"}, "a b/ünï.jsonl", "b.jsonl"]
    s3.put_object(Bucket="data", Key="manifests/m.json", Body=json.dumps(manifest).encode())

    proc = run_local(
        "transform",
        "--container-url",
        container,
        "--input",
        "s3://data/manifests/m.json",
        "--manifest",
        "--output",
        "s3://data/outputs/job-1",
        "--endpoint-url",
        s3_endpoint,
        "--max-payload-mb",
        "1",
        "--join-source",
        "Input",
        env=AWS_ENV,
    )
    summary = json.loads(proc.stdout[proc.stdout.index("{\n") :])
    assert summary["TransformJobStatus"] == "Completed"
    assert summary["records"] == 32 and summary["error_lines"] == 1
    keys = sorted(
        o["Key"] for o in s3.list_objects_v2(Bucket="data", Prefix="outputs/")["Contents"]
    )
    assert keys == ["outputs/job-1/a b/ünï.jsonl.out", "outputs/job-1/b.jsonl.out"]
    body = s3.get_object(Bucket="data", Key="outputs/job-1/a b/ünï.jsonl.out")["Body"].read()
    lines = body.decode().split("\n")
    assert lines[-1] == "" and len(lines) == 31  # AssembleWith=Line: a newline after each
    joined = [json.loads(x) for x in lines[:-1]]
    assert [j["id"] for j in joined] == list(range(30))
    assert all(j["SageMakerOutput"]["id"] == j["id"] for j in joined)
    b = s3.get_object(Bucket="data", Key="outputs/job-1/b.jsonl.out")["Body"].read().decode()
    first, second = b.rstrip("\n").split("\n")
    assert json.loads(first)["SageMakerOutput"]["task"] == "score"
    assert second.startswith("42,") and '"code":"invalid_record"' in second


def test_local_folder_single_record_and_no_split(container, tmp_path):
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    (src / "p.txt").write_text("The cat\nThe dog\n")
    (src / "sub" / "q.txt").write_text("The cow\n")
    out = tmp_path / "out"
    proc = run_local(
        "transform",
        "--container-url",
        container,
        "--input",
        str(src),
        "--output",
        str(out),
        "--content-type",
        "text/plain",
        "--strategy",
        "SingleRecord",
        "--max-concurrent-transforms",
        "3",
    )
    summary = json.loads(proc.stdout[proc.stdout.index("{\n") :])
    assert summary["BatchStrategy"] == "SingleRecord" and summary["records"] == 3
    assert len((out / "p.txt.out").read_text().splitlines()) == 2
    assert len((out / "sub" / "q.txt.out").read_text().splitlines()) == 1

    whole = tmp_path / "whole"
    run_local(
        "transform",
        "--container-url",
        container,
        "--input",
        str(src / "p.txt"),
        "--output",
        str(whole),
        "--content-type",
        "text/plain",
        "--split-type",
        "None",
        "--assemble-with",
        "None",
    )
    assert len((whole / "p.txt.out").read_text().split("\n")) == 2


@pytest.mark.slow
def test_a_failing_file_gets_no_output_and_fails_the_job(trained, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "good.jsonl").write_text('{"text": "The cat"}\n')
    (src / "bad.jsonl").write_bytes('{"text": "x"}\n'.encode("utf-16"))  # unreadable: a 400
    # one bad line (NaN is not JSON) is that line's error, never its file's or the job's
    (src / "nan.jsonl").write_text('{"id": NaN, "text": "a"}\n{"id": 2, "text": "The dog"}\n')
    out = tmp_path / "out"
    proc = run_local(
        "transform",
        "--model",
        str(trained["model"]),
        "--input",
        str(src),
        "--output",
        str(out),
        check=False,
    )
    assert proc.returncode == 1
    summary = json.loads(proc.stdout[proc.stdout.index("{\n") :])
    assert summary["TransformJobStatus"] == "Failed"
    assert "bad.jsonl" in summary["FailureReason"] and "UTF-16" in summary["FailureReason"]
    assert (out / "good.jsonl.out").exists() and not (out / "bad.jsonl.out").exists()
    nan = [json.loads(x) for x in (out / "nan.jsonl.out").read_text().splitlines()]
    assert nan[0]["error"]["code"] == "invalid_json" and nan[1]["id"] == 2


def test_gzip_inputs_and_batch_capture_manifests(container, s3_endpoint, tmp_path):
    """CompressionType=Gzip is read as SageMaker reads it; DataCaptureConfig writes manifests of
    the job's inputs and outputs (not copies) under input/ and output/, by hour."""
    import gzip

    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="cap")
    s3.put_object(
        Bucket="cap",
        Key="in/a.jsonl.gz",
        Body=gzip.compress(jsonl([{"id": i, "text": "The cat"} for i in range(3)])),
    )
    s3.put_object(Bucket="cap", Key="in/b.jsonl.gz", Body=b"not gzip at all")
    summary_file = tmp_path / "summary.json"
    proc = run_local(
        "transform",
        "--container-url",
        container,
        "--input",
        "s3://cap/in/",
        "--output",
        "s3://cap/out/",
        "--endpoint-url",
        s3_endpoint,
        "--compression",
        "Gzip",
        "--capture-uri",
        "s3://cap/capture/batch/job-1/",
        "--summary",
        str(summary_file),
        env=AWS_ENV,
        check=False,
    )
    assert proc.returncode == 1  # b.jsonl.gz fails the job, a.jsonl.gz still gets its output
    summary = json.loads(summary_file.read_text())
    assert summary["TransformJobStatus"] == "Failed" and "not gzip" in summary["FailureReason"]
    out = s3.get_object(Bucket="cap", Key="out/a.jsonl.gz.out")["Body"].read().decode()
    assert len(out.splitlines()) == 3
    listed = sorted(
        o["Key"] for o in s3.list_objects_v2(Bucket="cap", Prefix="capture/")["Contents"]
    )
    assert [k.split("/")[3] for k in listed] == ["input", "output"]
    docs = [json.loads(s3.get_object(Bucket="cap", Key=k)["Body"].read()) for k in listed]
    assert docs[0] == [{"prefix": "s3://cap/in/"}, "a.jsonl.gz", "b.jsonl.gz"]
    assert docs[1] == [{"prefix": "s3://cap/out/"}, "a.jsonl.gz.out"]


def test_lines_read_from_a_stream_are_the_lines_of_the_whole_body():
    """The streaming reader splits as split_lines does, wherever the chunks end."""
    import io
    import random

    from sluice.records import split_lines
    from sluice_local.transform import read_lines

    rng = random.Random(7)
    for _ in range(300):
        body = bytes(rng.choice(b"ab\r\n") for _ in range(rng.randrange(0, 40)))
        for chunk in (1, 2, 3, 7, 64):
            got = list(read_lines(io.BytesIO(body), max_line=100, chunk=chunk))
            assert got == list(split_lines(body)), (body, chunk)
    with pytest.raises(SluiceError, match="exceeds MaxPayloadInMB"):
        list(read_lines(io.BytesIO(b"x" * 1000), max_line=100, chunk=64))


def test_a_big_file_streams_through_in_bounded_memory(tmp_path):
    """A 256 MB file goes through in 1 MB payloads, read and written as it goes, in order:
    the driver's peak memory is not the file's size (it held it whole, 4 times over, before)."""
    import hashlib

    line = json.dumps({"text": "The lazy cat eats " * 5}).encode() + b"\n"
    block = line * (2**20 // len(line))
    for name, blocks in (("small", 1), ("big", 256)):
        (tmp_path / name).mkdir()
        with open(tmp_path / name / "in.jsonl", "wb") as f:
            for _ in range(blocks):
                f.write(block)
    peak = {}
    with EchoContainer(payload_mb=1) as url:
        for name in ("small", "big"):
            cmd = [sys.executable, "-m", "sluice_local.cli", "transform", "--container-url", url]
            cmd += ["--input", str(tmp_path / name), "--output", str(tmp_path / f"{name}-out")]
            cmd += ["--summary", str(tmp_path / f"{name}.json")]
            peak[name] = peak_rss_mb(cmd)
    summary = json.loads((tmp_path / "big.json").read_text())
    assert summary["TransformJobStatus"] == "Completed"
    assert summary["records"] == 256 * len(block) // len(line)
    digest = [
        hashlib.sha256((tmp_path / p).read_bytes()).hexdigest()
        for p in ("big/in.jsonl", "big-out/in.jsonl.out")
    ]
    assert digest[0] == digest[1]  # every line, in order (the container echoes)
    assert peak["big"] - peak["small"] < 64, peak  # 256 MB through; a few payloads in memory
    # a forked child's rusage counts the parent's pages before exec: the difference is the file's
    FIGURES.append(f"transform of 256 MB: peak RSS {peak['big'] - peak['small']:+.0f} MB over 1 MB")
