"""start_monitor with moto: one Processing job per window over that window's capture; requests
for both modes validated against botocore's SageMaker service model."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta

import boto3
import pytest
from moto import mock_aws

from sluice_local.validation import request_problems
from tests.helpers import LambdaContext as Context
from tests.helpers import lambda_env

# every request checked against AWS's own rules (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("strict_aws")

REGION = "us-east-1"
ACCOUNT = "123456789012"
BUCKET = "sluice-dev-data"
PARAM = "/sluice/dev/current-model"
MODEL = "sluice-dev-0123abcd"
ENV = lambda_env(
    MODEL_PARAMETER=PARAM,
    IMAGE_URI=f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/sluice:1",
    SAGEMAKER_ROLE_ARN=f"arn:aws:iam::{ACCOUNT}:role/sm",
    ENDPOINT_NAME="sluice-dev",
    KMS_KEY_ARN=f"arn:aws:kms:{REGION}:{ACCOUNT}:key/k",
    MONITORING_MODE="Processing",
)


def validate(operation: str, request: dict) -> None:
    """Check a request as botocore and then SageMaker would (types, required members, patterns,
    lengths, ranges, enums): what moto cannot answer is still checked as AWS would."""
    found = request_problems("sagemaker", operation, request)
    assert not found, found


@pytest.fixture
def aws(monkeypatch):
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        from aws_lambda_powertools.utilities import parameters

        from sluice_functions.aws import client

        client.cache_clear()
        parameters.clear_caches()  # a warm container's cached model parameter
        s3 = boto3.client("s3", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        boto3.client("ssm", region_name=REGION).put_parameter(
            Name=PARAM, Value=MODEL, Type="String"
        )
        from sluice_functions import start_monitor

        yield {"s3": s3, "handler": start_monitor.handler, "module": start_monitor}


def put_baseline(s3) -> None:
    for name in ("statistics.json", "constraints.json", "tokenizer/tokenizer.json"):
        s3.put_object(Bucket=BUCKET, Key=f"monitoring/baseline/{MODEL}/{name}", Body=b"{}")


def freeze(monkeypatch, module, when: datetime) -> None:
    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return when

    monkeypatch.setattr(module, "datetime", Frozen)


def test_one_processing_job_per_window_over_that_windows_capture(aws, monkeypatch):
    s3 = aws["s3"]
    put_baseline(s3)
    # moto stamps objects with the real time: the window is the hour they are written in
    now = datetime.now(UTC)
    if now.minute == 59 and now.second > 50:
        time.sleep(11)
        now = datetime.now(UTC)
    hour = f"{now:%Y/%m/%d/%H}"
    endpoint_keys = [
        f"capture/endpoint/sluice-dev/AllTraffic/{hour}/00-01-abc.jsonl",
        f"capture/endpoint/sluice-dev/AllTraffic/{hour}/30-07-def.jsonl",
    ]
    for k in endpoint_keys:
        s3.put_object(Bucket=BUCKET, Key=k, Body=b'{"captureData": {}}\n')
    # batch capture is manifests of the job's inputs and outputs, as SageMaker writes it
    batch = {
        "input": [{"prefix": f"s3://{BUCKET}/incoming/team-a/"}, "a.jsonl", "b.jsonl"],
        "output": [{"prefix": f"s3://{BUCKET}/outputs/sluice-dev-job1/"}, "a.jsonl.out"],
    }
    for kind, doc in batch.items():
        s3.put_object(
            Bucket=BUCKET,
            Key=f"capture/batch/sluice-dev-job1/{kind}/{hour}/m.json",
            Body=json.dumps(doc).encode(),
        )
    s3.put_object(
        Bucket=BUCKET,
        Key=f"capture/batch/other/input/{hour}/m.json",
        Body=json.dumps([{"prefix": "s3://another-bucket/x/"}, "y.jsonl"]).encode(),
    )
    s3.put_object(
        Bucket=BUCKET, Key="capture/endpoint/sluice-dev/AllTraffic/2020/01/01/00/old", Body=b"{}"
    )
    # during the hour, the window that just ended holds none of them: no job
    freeze(monkeypatch, aws["module"], now)
    assert aws["handler"]({}, Context())["outcome"] == "empty"
    # once the hour is over, its window holds the endpoint capture and what batch capture names
    boundary = datetime.fromtimestamp(int(now.timestamp()) // 3600 * 3600 + 3600, UTC)
    freeze(monkeypatch, aws["module"], boundary)
    out = aws["handler"]({}, Context())
    expected = [
        *endpoint_keys,
        "incoming/team-a/a.jsonl",
        "incoming/team-a/b.jsonl",
        "outputs/sluice-dev-job1/a.jsonl.out",
    ]
    assert out["outcome"] == "started" and out["objects"] == len(expected)
    # named for the window's start: the hour before the boundary (crosses midnight correctly)
    assert out["job"] == f"sluice-dev-monitor-{boundary - timedelta(hours=1):%Y%m%d%H}00"
    job = boto3.client("sagemaker", region_name=REGION).describe_processing_job(
        ProcessingJobName=out["job"]
    )
    inputs = {i["InputName"]: i["S3Input"] for i in job["ProcessingInputs"]}
    assert inputs["capture"]["S3DataType"] == "ManifestFile"
    assert inputs["baseline"]["S3Uri"] == f"s3://{BUCKET}/monitoring/baseline/{MODEL}/"
    assert job["AppSpecification"]["ContainerEntrypoint"] == ["sluice", "monitor"]
    manifest = json.loads(
        s3.get_object(Bucket=BUCKET, Key=f"manifests/{out['job']}.json")["Body"].read()
    )
    prefix = manifest[0]["prefix"].removeprefix(f"s3://{BUCKET}/")
    assert sorted(prefix + k for k in manifest[1:]) == sorted(expected)
    # the output is where retrain_trigger looks for constraint_violations.json
    [output] = job["ProcessingOutputConfig"]["Outputs"]
    assert output["S3Output"]["S3Uri"] == f"s3://{BUCKET}/monitoring/{out['job']}/output"
    # the schedule fires twice for one window: one job
    assert aws["handler"]({}, Context())["outcome"] == "duplicate"
    # an operator asks for the window ending now: the hour so far, under its own name
    later = boundary.replace(minute=30)
    freeze(monkeypatch, aws["module"], later)
    asked = aws["handler"]({"end": "now"}, Context())
    assert asked["job"] == f"sluice-dev-monitor-{later - timedelta(hours=1):%Y%m%d%H%M}"


def test_no_baseline_yet_is_reported_not_silently_skipped(aws):
    out = aws["handler"]({}, Context())
    assert out["outcome"] == "no-baseline"


def test_no_champion_yet_starts_nothing(aws):
    boto3.client("ssm", region_name=REGION).put_parameter(
        Name=PARAM, Value="none", Type="String", Overwrite=True
    )
    assert aws["handler"]({}, Context())["outcome"] == "no-model"


def test_requests_of_both_modes_match_the_sagemaker_api(monkeypatch):
    for k, v in {**ENV, "SUBNET_IDS": "subnet-1,subnet-2", "SECURITY_GROUP_IDS": "sg-1"}.items():
        monkeypatch.setenv(k, v)
    from sluice_functions import monitoring as m

    s = m.MonitorSettings.from_env(dict(os.environ))
    start, end = m.window_of(datetime(2026, 12, 2, 10, 17, tzinfo=UTC), 3600)
    assert (start.hour, end.hour) == (9, 10)
    asked = m.requested_window({"end": "2026-12-02T10:17:00Z"}, datetime.now(UTC), 3600)
    assert asked == (
        datetime(2026, 12, 2, 9, 17, tzinfo=UTC),
        datetime(2026, 12, 2, 10, 17, tzinfo=UTC),
    )
    name = m.job_name("dev", start)
    assert name == "sluice-dev-monitor-202612020900"
    request = m.processing_request(s, name, MODEL, f"manifests/{name}.json", start, end)
    validate("CreateProcessingJob", request)
    assert request["Environment"]["SLUICE_MODEL_DIR"] == "/opt/ml/processing/baseline/tokenizer"
    assert request["Environment"]["start_time"] == "2026-12-02T09:00:00Z"
    assert request["NetworkConfig"]["VpcConfig"]["Subnets"] == ["subnet-1", "subnet-2"]
    schedule = m.schedule_request(s, MODEL, m.cron_for(3600))
    validate("CreateMonitoringSchedule", schedule)
    validate("UpdateMonitoringSchedule", schedule)
    job = schedule["MonitoringScheduleConfig"]["MonitoringJobDefinition"]
    assert job["BaselineConfig"]["StatisticsResource"]["S3Uri"].endswith(
        f"monitoring/baseline/{MODEL}/statistics.json"
    )
    assert "dataset_source" not in job["Environment"]  # Model Monitor sets its own
    assert job["Environment"]["SLUICE_TOKENIZER_S3_URI"].endswith(f"{MODEL}/tokenizer/")
