"""The batch path with moto: S3 upload -> SQS -> start_transform -> transform job -> reports."""

from __future__ import annotations

import json
import uuid

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from sluice.openai_batch import Request, output_line
from sluice_functions.prices import TRANSFORM_USD_PER_HOUR
from tests.helpers import LambdaContext as Context
from tests.helpers import lambda_env, template_resource

# every request checked against AWS's own rules (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("strict_aws")

BUCKET = "sluice-dev-data"
REGION = "us-east-1"
ACCOUNT = "123456789012"
PARAM = "/sluice/dev/current-model"


@pytest.fixture
def aws(monkeypatch):
    env = lambda_env(
        POWERTOOLS_TRACE_DISABLED="true",
        MODEL_PARAMETER=PARAM,
        SAGEMAKER_ROLE_ARN=f"arn:aws:iam::{ACCOUNT}:role/sm",
        KMS_KEY_ARN=f"arn:aws:kms:{REGION}:{ACCOUNT}:key/k",
        MAX_FILES_PER_JOB="1000",
        CLAIMS_TABLE="claims",
    )
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with mock_aws():
        from aws_lambda_powertools.utilities import parameters

        from sluice_functions.aws import client

        client.cache_clear()
        parameters.clear_caches()
        s3 = boto3.client("s3", region_name=REGION)
        sqs = boto3.client("sqs", region_name=REGION)
        sns = boto3.client("sns", region_name=REGION)
        sm = boto3.client("sagemaker", region_name=REGION)
        s3.create_bucket(Bucket=BUCKET)
        table = template_resource("ClaimsTable")["Properties"]  # as deployed
        boto3.client("dynamodb", region_name=REGION).create_table(
            TableName="claims",
            BillingMode=table["BillingMode"],
            AttributeDefinitions=table["AttributeDefinitions"],
            KeySchema=table["KeySchema"],
            GlobalSecondaryIndexes=table["GlobalSecondaryIndexes"],
        )
        queue = sqs.create_queue(QueueName="incoming")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        s3.put_bucket_notification_configuration(
            Bucket=BUCKET,
            NotificationConfiguration={
                "QueueConfigurations": [
                    {
                        "QueueArn": queue_arn,
                        "Events": ["s3:ObjectCreated:*"],
                        "Filter": {
                            "Key": {"FilterRules": [{"Name": "prefix", "Value": "incoming/"}]}
                        },
                    }
                ]
            },
        )
        topic = sns.create_topic(Name="notifications")["TopicArn"]
        inbox = sqs.create_queue(QueueName="inbox")["QueueUrl"]
        inbox_arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])[
            "Attributes"
        ]["QueueArn"]
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=inbox_arn)
        monkeypatch.setenv("TOPIC_ARN", topic)
        monkeypatch.setenv("INCOMING_QUEUE_URL", queue)  # where waiting uploads go back
        monkeypatch.setenv("QUOTA_RETRY_SECONDS", "1")
        sm.create_model(
            ModelName="sluice-dev-model-1",
            ExecutionRoleArn=env["SAGEMAKER_ROLE_ARN"],
            PrimaryContainer={"Image": f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/sluice:1"},
        )
        boto3.client("ssm", region_name=REGION).put_parameter(
            Name=PARAM, Value="sluice-dev-model-1", Type="String"
        )
        yield {"s3": s3, "sqs": sqs, "sm": sm, "queue": queue, "inbox": inbox, "topic": topic}


def sqs_event(aws, expect: int | None = None) -> dict:
    """Receive what S3 delivered to the queue and shape it as Lambda's SQS event."""
    records = []
    while True:
        got = (
            aws["sqs"]
            .receive_message(
                QueueUrl=aws["queue"],
                MaxNumberOfMessages=10,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            .get("Messages", [])
        )
        if not got:
            break
        for m in got:
            records.append(
                {
                    "messageId": m["MessageId"],
                    "receiptHandle": m["ReceiptHandle"],
                    "body": m["Body"],
                    "attributes": {**m["Attributes"], "ApproximateReceiveCount": "1"},
                    "messageAttributes": {
                        k: {"stringValue": v["StringValue"], "dataType": v["DataType"]}
                        for k, v in m.get("MessageAttributes", {}).items()
                    },
                    "md5OfBody": m["MD5OfBody"],
                    "eventSource": "aws:sqs",
                    "eventSourceARN": f"arn:aws:sqs:{REGION}:{ACCOUNT}:incoming",
                    "awsRegion": REGION,
                }
            )
    if expect is not None:
        assert len(records) == expect
    return {"Records": records}


def start(event):
    from sluice_functions import start_transform

    return start_transform.handler(event, Context())


def jobs(aws) -> list[dict]:
    names = [
        j["TransformJobName"] for j in aws["sm"].list_transform_jobs()["TransformJobSummaries"]
    ]
    return [aws["sm"].describe_transform_job(TransformJobName=n) for n in names]


def upload(aws, key: str, lines: int = 3):
    body = "\n".join(json.dumps({"id": i, "text": f"prompt {i}"}) for i in range(lines)) + "\n"
    aws["s3"].put_object(Bucket=BUCKET, Key=key, Body=body.encode())


def test_uploads_coalesce_into_one_manifest_job_per_content_type(aws, capfd, caplog):
    keys = ["incoming/a b/ünicode é.jsonl", "incoming/b.jsonl", "incoming/c.txt"]
    for k in keys:
        upload(aws, k)
    upload(aws, "outputs/not-mine.jsonl")  # outside the prefix: no notification at all
    aws["s3"].put_object(Bucket=BUCKET, Key="incoming/empty.jsonl", Body=b"")
    event = sqs_event(aws, expect=5)  # S3's test event + 4 object events
    assert start(event) == {"batchItemFailures": []}
    # one job per content type: the JSON Lines uploads together, the plain text one apart
    by_type = {j["TransformInput"]["ContentType"]: j for j in jobs(aws)}
    assert sorted(by_type) == ["application/jsonlines", "text/plain"]
    job = by_type["application/jsonlines"]
    assert job["ModelName"] == "sluice-dev-model-1"
    src = job["TransformInput"]["DataSource"]["S3DataSource"]
    assert src["S3DataType"] == "ManifestFile"
    manifest = json.loads(
        aws["s3"].get_object(Bucket=BUCKET, Key=src["S3Uri"].split("/", 3)[3])["Body"].read()
    )
    assert manifest[0] == {"prefix": f"s3://{BUCKET}/incoming/"}
    assert sorted(manifest[1:]) == sorted(k.removeprefix("incoming/") for k in keys[:2])
    skipped = [r.__dict__.get("reason") for r in caplog.records if r.getMessage() == "skipped"]
    assert "s3:TestEvent" in skipped and "zero-byte object" in skipped
    assert '"JobsStarted"' in capfd.readouterr().out  # an EMF metric


@pytest.mark.parametrize("claims", [True, False], ids=["claims", "job-name-only"])
def test_a_redelivered_batch_starts_nothing_twice(aws, capfd, monkeypatch, claims):
    if not claims:  # the content-derived job name alone catches an identical batch
        monkeypatch.delenv("CLAIMS_TABLE")
    upload(aws, "incoming/x.jsonl")
    event = sqs_event(aws)
    start(event)
    start(event)
    assert len(jobs(aws)) == 1
    metric = '"DuplicateUploads":[1.0]' if claims else '"DuplicateBatches":[1.0]'
    assert metric in capfd.readouterr().out


@pytest.mark.parametrize("claims", [True, False], ids=["claims", "job-name-only"])
def test_a_batch_whose_job_failed_runs_again_when_delivered_again(aws, monkeypatch, caplog, claims):
    """Never swallowed: each redelivery after a failure is a new job (SageMaker never reuses a
    name), up to three; then the messages are not acknowledged, so they go on to the DLQ."""
    from moto.sagemaker.models import sagemaker_backends

    if not claims:
        monkeypatch.delenv("CLAIMS_TABLE")
    upload(aws, "incoming/x.jsonl")
    event = sqs_event(aws)
    assert start(event) == {"batchItemFailures": []}
    backend = sagemaker_backends[ACCOUNT][REGION]
    failed: list[str] = []
    for attempt in range(1, 4):
        [job] = [j for j in jobs(aws) if j["TransformJobName"] not in failed]
        assert manifest_keys(aws, job) == [f"s3://{BUCKET}/incoming/x.jsonl"]
        backend.transform_jobs[job["TransformJobName"]].transform_job_status = "Failed"
        failed.append(job["TransformJobName"])
        result = start(event)  # the same messages again (a crash, or a redrive)
        if attempt < 3:
            assert result == {"batchItemFailures": []}
            assert len(jobs(aws)) == attempt + 1
    [x] = [r["messageId"] for r in event["Records"] if "x.jsonl" in r["body"]]
    assert result == {"batchItemFailures": [{"itemIdentifier": x}]}
    assert len(jobs(aws)) == 3 and len(set(failed)) == 3
    assert "its messages go on to the DLQ" in caplog.text
    # a completed attempt is what the batch is: delivered again, nothing starts
    backend.transform_jobs[failed[-1]].transform_job_status = "Completed"
    assert start(event) == {"batchItemFailures": []} and len(jobs(aws)) == 3


def manifest_keys(aws, job: dict) -> list[str]:
    uri = job["TransformInput"]["DataSource"]["S3DataSource"]["S3Uri"]
    doc = json.loads(aws["s3"].get_object(Bucket=BUCKET, Key=uri.split("/", 3)[3])["Body"].read())
    return [doc[0]["prefix"] + k for k in doc[1:]]


def test_a_duplicate_event_in_another_batch_is_not_transformed_twice(aws, caplog):
    upload(aws, "incoming/x.jsonl")
    first = sqs_event(aws)
    start(first)
    upload(aws, "incoming/y.jsonl")
    second = sqs_event(aws)
    # S3 delivered x's event again, into a later batch with y's
    x_event = next(r for r in first["Records"] if "x.jsonl" in r["body"])
    second["Records"].append({**x_event, "messageId": str(uuid.uuid4())})
    assert start(second) == {"batchItemFailures": []}
    by_keys = sorted(manifest_keys(aws, j) for j in jobs(aws))
    assert by_keys == [[f"s3://{BUCKET}/incoming/x.jsonl"], [f"s3://{BUCKET}/incoming/y.jsonl"]]
    assert "duplicate upload: already in a job" in caplog.text


def test_uploads_claimed_by_an_invocation_in_flight_are_retried_and_stale_claims_taken_over(aws):
    import time

    from sluice_functions.batching import Upload

    upload(aws, "incoming/x.jsonl")
    event = sqs_event(aws)
    (rec,) = [r for r in event["Records"] if "x.jsonl" in r["body"]]
    body = json.loads(rec["body"])["Records"][0]["s3"]["object"]
    identity = Upload(
        "", BUCKET, "incoming/x.jsonl", 1, body["eTag"], body.get("versionId")
    ).identity
    ddb = boto3.client("dynamodb", region_name=REGION)

    def claimed(seconds_ago: int) -> None:
        ddb.put_item(
            TableName="claims",
            Item={
                "object": {"S": identity},
                "job": {"S": "sluice-dev-elsewhere"},
                "claimed": {"N": str(int(time.time()) - seconds_ago)},
            },
        )

    claimed(5)  # another invocation is creating its job right now
    assert start(event)["batchItemFailures"] == [{"itemIdentifier": rec["messageId"]}]
    assert jobs(aws) == []
    claimed(3600)  # left by a crash before its job existed
    assert start(event) == {"batchItemFailures": []}
    assert len(jobs(aws)) == 1


def refuse_with(monkeypatch, code: str, message: str):
    """CreateTransformJob answers this error (as SageMaker words it) until the patch is undone."""
    from sluice_functions.aws import client

    def refused(**kw):
        raise ClientError({"Error": {"Code": code, "Message": message}}, "CreateTransformJob")

    monkeypatch.setattr(client("sagemaker"), "create_transform_job", refused)


def quota_message(limit: int, used: int) -> str:
    """The local SageMaker's ResourceLimitExceeded for one more ml.g5.xlarge instance: the same
    text the handler reads on AWS."""
    from sluice_local.sagemaker.quotas import check
    from sluice_local.sagemaker.shapes import ApiError

    job = {"TransformResources": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 1}}
    with pytest.raises(ApiError) as e:
        check("TransformJob", job, [job] * used, {"ml.g5.xlarge for transform job usage": limit})
    assert e.value.code == "ResourceLimitExceeded"
    return e.value.message


def delayed(aws) -> int:
    attrs = aws["sqs"].get_queue_attributes(QueueUrl=aws["queue"], AttributeNames=["All"])
    return int(attrs["Attributes"]["ApproximateNumberOfMessagesDelayed"])


@pytest.mark.parametrize(
    "code, message",
    [("ResourceLimitExceeded", None), ("ThrottlingException", "Rate exceeded")],
)
def test_work_that_cannot_start_yet_waits_in_the_queue_not_the_dlq(aws, monkeypatch, code, message):
    """The quota in use (or CreateTransformJob throttled): the messages go back to the queue,
    delayed, and are acknowledged, so no receive counts towards the DLQ; once the quota frees,
    the same uploads start their job."""
    import time

    upload(aws, "incoming/x.jsonl")
    upload(aws, "incoming/y.jsonl")
    first = sqs_event(aws)
    bodies = sorted(r["body"] for r in first["Records"] if "TestEvent" not in r["body"])
    with monkeypatch.context() as m:
        refuse_with(m, code, message or quota_message(limit=1, used=1))
        assert start(first) == {"batchItemFailures": []}
    assert jobs(aws) == [] and delayed(aws) == 2
    time.sleep(1.5)  # QUOTA_RETRY_SECONDS=1: the first wait is a second
    again = sqs_event(aws, expect=2)
    assert sorted(r["body"] for r in again["Records"]) == bodies
    for r in again["Records"]:
        waits = r["messageAttributes"]
        assert waits["SluiceWaits"]["stringValue"] == "1"
        assert float(waits["SluiceWaitingSince"]["stringValue"]) <= time.time()
    assert start(again) == {"batchItemFailures": []}
    [job] = jobs(aws)
    assert len(job_inputs(aws, job)) == 2


def job_inputs(aws, job: dict) -> list[str]:
    uri = job["TransformInput"]["DataSource"]["S3DataSource"]["S3Uri"]
    manifest = aws["s3"].get_object(Bucket=BUCKET, Key=uri.split("/", 3)[3])["Body"].read()
    return json.loads(manifest)[1:]


def test_a_quota_smaller_than_one_job_fails_at_once_with_a_report(aws, monkeypatch):
    """A quota of 0 instances (a new account's, for many GPU types) never fits: waiting would
    not help, so the uploads fail as before (retried, then the DLQ) with a report that names
    the quota to raise."""
    upload(aws, "incoming/x.jsonl")
    event = sqs_event(aws)
    refuse_with(monkeypatch, "ResourceLimitExceeded", quota_message(limit=0, used=0))
    failures = start(event)["batchItemFailures"]
    assert len(failures) == 1 and delayed(aws) == 0
    [report_key] = [
        o["Key"] for o in aws["s3"].list_objects_v2(Bucket=BUCKET, Prefix="outputs/")["Contents"]
    ]
    report = json.loads(aws["s3"].get_object(Bucket=BUCKET, Key=report_key)["Body"].read())
    assert report["status"] == "ResourceLimitExceeded"
    assert "'ml.g5.xlarge for transform job usage' is 0" in report["reason"]
    assert "Service Quotas" in report["reason"]
    assert notifications(aws)


def test_work_that_waited_past_the_limit_fails_with_a_report(aws, monkeypatch):
    import time

    monkeypatch.setenv("MAX_WAIT_HOURS", "1")
    upload(aws, "incoming/x.jsonl")
    event = sqs_event(aws)
    [record] = [r for r in event["Records"] if "TestEvent" not in r["body"]]
    record["messageAttributes"] = {
        "SluiceWaits": {"stringValue": "9", "dataType": "Number"},
        "SluiceWaitingSince": {"stringValue": str(time.time() - 3700), "dataType": "Number"},
    }
    refuse_with(monkeypatch, "ResourceLimitExceeded", quota_message(limit=2, used=2))
    failures = start({"Records": [record]})["batchItemFailures"]
    assert failures == [{"itemIdentifier": record["messageId"]}] and delayed(aws) == 0
    [report_key] = [
        o["Key"] for o in aws["s3"].list_objects_v2(Bucket=BUCKET, Prefix="outputs/")["Contents"]
    ]
    report = json.loads(aws["s3"].get_object(Bucket=BUCKET, Key=report_key)["Body"].read())
    assert report["status"] == "QuotaWaitExpired" and "waited 1.0 h" in report["reason"]


def test_malformed_messages_are_acknowledged_and_counted(aws, capfd, caplog):
    event = {
        "Records": [
            {
                "messageId": str(uuid.uuid4()),
                "receiptHandle": "h",
                "body": "{not json",
                "attributes": {"ApproximateReceiveCount": "1"},
                "messageAttributes": {},
                "md5OfBody": "",
                "eventSource": "aws:sqs",
                "eventSourceARN": "arn",
                "awsRegion": REGION,
            }
        ]
    }
    assert start(event) == {"batchItemFailures": []}
    assert "malformed message acknowledged" in caplog.text
    assert '"MalformedMessages":[1.0]' in capfd.readouterr().out


def test_no_model_yet_fails_loudly_and_keeps_the_uploads(aws, caplog):
    boto3.client("ssm", region_name=REGION).put_parameter(
        Name=PARAM, Value="none", Type="String", Overwrite=True
    )
    upload(aws, "incoming/x.jsonl")
    event = sqs_event(aws)
    failures = start(event)["batchItemFailures"]
    assert len(failures) == 1  # back to the queue, then its DLQ: nothing lost
    assert jobs(aws) == []
    reports = [
        o["Key"]
        for o in aws["s3"].list_objects_v2(Bucket=BUCKET, Prefix="outputs/").get("Contents", [])
    ]
    assert len(reports) == 1 and reports[0].endswith("/_FAILURE.json")
    report = json.loads(aws["s3"].get_object(Bucket=BUCKET, Key=reports[0])["Body"].read())
    assert report["status"] == "NoModel" and "incoming/x.jsonl" in report["inputs"]
    assert "no model yet" in caplog.text
    assert notifications(aws)


def notifications(aws) -> list[dict]:
    """The reports notified (the JSON after a notification's lines for people)."""
    return [json.loads(text[text.index("{") :]) for _, text in notified(aws)]


def notified(aws) -> list[tuple[str, str]]:
    """(subject, message) of each notification on the topic."""
    got = aws["sqs"].receive_message(QueueUrl=aws["inbox"], MaxNumberOfMessages=10)
    bodies = [json.loads(m["Body"]) for m in got.get("Messages", [])]
    return [(b["Subject"], b["Message"]) for b in bodies]


# --- transform_finished --------------------------------------------------------------------------


def state_change(job: dict, status: str, reason: str | None = None) -> dict:
    """An event shaped like AWS's "SageMaker Transform Job State Change" sample."""
    detail = {
        "TransformJobName": job["TransformJobName"],
        "TransformJobArn": job["TransformJobArn"],
        "TransformJobStatus": status,
        "ModelName": job["ModelName"],
        "TransformInput": job["TransformInput"],
        "TransformOutput": job["TransformOutput"],
        "TransformResources": job["TransformResources"],
        "CreationTime": 1_700_000_000_000,
        "TransformStartTime": 1_700_000_060_000,
        "TransformEndTime": 1_700_000_660_000,
        "Tags": {},
    }
    if reason:
        detail["FailureReason"] = reason
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "SageMaker Transform Job State Change",
        "source": "aws.sagemaker",
        "account": ACCOUNT,
        "time": "2026-12-02T12:00:00Z",
        "region": REGION,
        "resources": [job["TransformJobArn"]],
        "detail": detail,
    }


def finished(event):
    from sluice_functions import transform_finished

    return transform_finished.handler(event, Context(function_name="transform-finished"))


def started_job(aws) -> dict:
    upload(aws, "incoming/p/a.jsonl", lines=3)
    upload(aws, "incoming/p/b.jsonl", lines=2)
    start(sqs_event(aws))
    (job,) = jobs(aws)
    return job


DONE = {"finish_reason": "length", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}


def used(prompt: int, completion: int) -> str:
    return json.dumps(
        {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
        separators=(",", ":"),
    )


def test_completed_job_gets_a_success_report_once(aws, capfd):
    job = started_job(aws)
    out = job["TransformOutput"]["S3OutputPath"]
    prefix = out.split("/", 3)[3]
    aws["s3"].put_object(
        Bucket=BUCKET,
        Key=f"{prefix}p/a.jsonl.out",  # its input path below incoming/
        Body=(
            f'{{"id":0,"generated_text":"a","usage":{used(4, 3)}}}\n'
            '{"id":1,"error":{"code":"x","message":"y"}}\n'
            f'{{"id":2,"generated_text":"b","usage":{used(5, 2)}}}\n'
        ).encode(),
    )
    # b.jsonl held OpenAI batch requests: its failed one is copied to OpenAI's error file
    ok = output_line(Request("r-1", "/v1/completions"), {"generated_text": "x", **DONE})
    failed = output_line(Request("r-2"), {"error": {"code": "too_long", "message": "m"}})
    body = "\n".join(json.dumps(x) for x in (ok, failed)) + "\n"
    aws["s3"].put_object(Bucket=BUCKET, Key=f"{prefix}p/b.jsonl.out", Body=body.encode())
    first = finished(state_change(job, "Completed"))
    assert first["written"] is True and first["report"] == f"{prefix}_SUCCESS.json"
    assert first["job"] == job["TransformJobName"] and first["status"] == "Completed"
    report = json.loads(aws["s3"].get_object(Bucket=BUCKET, Key=first["report"])["Body"].read())
    assert (report["records"], report["error_lines"], report["duration_s"]) == (5, 2, 600.0)
    assert [f["records"] for f in report["outputs"]] == [3, 2]
    # token usage summed per output and per job (the OpenAI line's usage is DONE's 1 + 1)
    assert [f["input_tokens"] for f in report["outputs"]] == [9, 1]
    assert (report["input_tokens"], report["output_tokens"]) == (10, 6)
    kind, count = (
        job["TransformResources"]["InstanceType"],
        job["TransformResources"]["InstanceCount"],
    )
    assert (report["instance_type"], report["instance_seconds"]) == (kind, 600.0 * count)
    cost = report["cost"]
    assert cost["usd"] == round(600 * count / 3600 * TRANSFORM_USD_PER_HOUR[kind], 6) > 0
    emf = capfd.readouterr().out
    for metric in ('"Records":[5.0]', '"ErrorLines":[2.0]', '"InputTokens":[10.0]'):
        assert metric in emf, emf  # one EMF document per job, with its figures
    assert '"OutputTokens":[6.0]' in emf and f'"InstanceSeconds":[{600.0 * count}]' in emf
    errors = f"{prefix}p/b.jsonl.errors.jsonl"
    assert [f.get("errors") for f in report["outputs"]] == [None, f"s3://{BUCKET}/{errors}"]
    lines = aws["s3"].get_object(Bucket=BUCKET, Key=errors)["Body"].read().splitlines()
    assert [json.loads(x)["custom_id"] for x in lines] == ["r-2"]
    assert report["inputs"] == [f"s3://{BUCKET}/incoming/p/{n}.jsonl" for n in "ab"]
    assert finished(state_change(job, "Completed"))["written"] is False  # duplicate event
    # one notification (not two: the duplicate event wrote nothing), its first lines for people
    [(subject, text)] = notified(aws)
    assert subject == f"Sluice transform completed: {job['TransformJobName']}"
    lines = text.splitlines()
    assert lines[0] == f"Transform job {job['TransformJobName']} completed in 10 min 0 s."
    assert lines[1].startswith("2 input file(s): 5 records, 2 error lines; 10 tokens in, 6 out")
    assert f"about ${cost['usd']:.2f} ({kind} x{count})" in lines[1]
    assert lines[2].startswith(f"Outputs: s3://{BUCKET}/{prefix} ")
    assert lines[3] == f"Report: s3://{BUCKET}/{prefix}_SUCCESS.json"


def test_failed_job_reports_and_notifies_once(aws):
    job = started_job(aws)
    event = state_change(job, "Failed", "ClientError: model container failed a ping")
    first = finished(event)
    assert first["report"].endswith("/_FAILURE.json") and first["written"]
    report = json.loads(aws["s3"].get_object(Bucket=BUCKET, Key=first["report"])["Body"].read())
    assert report["reason"] == "ClientError: model container failed a ping"
    assert len(report["inputs"]) == 2
    assert finished(event)["written"] is False
    [(subject, text)] = notified(aws)
    note = json.loads(text[text.index("{") :])
    assert note["job"] == job["TransformJobName"] and note["status"] == "Failed"
    assert subject == f"Sluice transform failed: {job['TransformJobName']}"
    first = text.splitlines()[:4]
    assert first[0].startswith(f"Transform job {job['TransformJobName']}: Failed")
    assert first[1] == "Why: ClientError: model container failed a ping"
    assert first[2].startswith("Inputs (2): s3://")
    assert first[3].endswith("Runbook: docs/batch.md#transform-jobs-failed")


def test_a_failed_job_whose_manifest_is_gone_still_names_its_uploads(aws):
    """The claims table's by-job index names the uploads when the manifest cannot be read."""
    job = started_job(aws)
    manifest = job["TransformInput"]["DataSource"]["S3DataSource"]["S3Uri"]
    aws["s3"].delete_object(Bucket=BUCKET, Key=manifest.split("/", 3)[3])
    first = finished(state_change(job, "Failed", "ClientError: manifest not found"))
    report = json.loads(aws["s3"].get_object(Bucket=BUCKET, Key=first["report"])["Body"].read())
    assert report["inputs"] == [f"s3://{BUCKET}/incoming/p/{n}.jsonl" for n in "ab"]
    assert report["inputs_from"].startswith("claims")


CAPACITY = (  # SageMaker's FailureReason for a job it found no instances for
    "CapacityError: Unable to provision requested ML compute capacity. Please retry using a "
    "different ML instance type."
)


def fail(job: dict, reason: str) -> dict:
    """The job failed on SageMaker's side (moto's record), and its state-change event."""
    from moto.sagemaker.models import sagemaker_backends

    record = sagemaker_backends[ACCOUNT][REGION].transform_jobs[job["TransformJobName"]]
    record.transform_job_status = "Failed"
    record.failure_reason = reason
    return state_change(job, "Failed", reason)


def reports(aws, name: str) -> list[str]:
    listed = aws["s3"].list_objects_v2(Bucket=BUCKET, Prefix=f"outputs/{name}/")
    return sorted(o["Key"].rsplit("/", 1)[1] for o in listed.get("Contents", []))


def test_a_job_that_found_no_capacity_waits_and_does_not_count_as_an_attempt(aws):
    """CapacityError after the job was created is waiting, not failing: the uploads go back to
    the queue as S3 notifications (delayed, counted), run in a new job, and such jobs never use
    up the batch's three attempts; a duplicate state-change event starts nothing twice."""
    import time

    job = started_job(aws)
    inputs = job_inputs(aws, job)
    event = fail(job, CAPACITY)
    first = finished(event)
    assert first["waiting"] and first["written"] and first["report"].endswith("/_WAITING.json")
    assert finished(event)["written"] is False  # EventBridge delivered it twice
    assert reports(aws, job["TransformJobName"]) == ["_WAITING.json"] and notified(aws) == []
    report = json.loads(aws["s3"].get_object(Bucket=BUCKET, Key=first["report"])["Body"].read())
    assert report["reason"] == CAPACITY and report["waits"] == 1
    assert report["uploads"] == [f"s3://{BUCKET}/incoming/p/{n}.jsonl" for n in "ab"]
    assert delayed(aws) == 4  # two uploads, sent back once per event
    time.sleep(2.5)  # QUOTA_RETRY_SECONDS=1: the first wait is at most 2 s
    again = sqs_event(aws, expect=4)
    for r in again["Records"]:
        assert r["messageAttributes"]["SluiceWaits"]["stringValue"] == "1"
    assert start(again) == {"batchItemFailures": []}  # the copies are duplicates (claims)
    [retry] = [j for j in jobs(aws) if j["TransformJobName"] != job["TransformJobName"]]
    assert job_inputs(aws, retry) == inputs
    # three more capacity failures, each delivered again: every one is a new job (three
    # failures of any other kind end the batch: test_a_batch_whose_job_failed_runs_again...)
    names = {job["TransformJobName"], retry["TransformJobName"]}
    for _ in range(3):
        fail(retry, CAPACITY)
        assert start(again) == {"batchItemFailures": []}
        [retry] = [j for j in jobs(aws) if j["TransformJobName"] not in names]
        names.add(retry["TransformJobName"])
    assert len(jobs(aws)) == 5 and job_inputs(aws, retry) == inputs


def test_a_job_that_waited_for_capacity_past_the_limit_fails_with_a_report(aws, monkeypatch):
    import time

    monkeypatch.setenv("MAX_WAIT_HOURS", "1")
    upload(aws, "incoming/x.jsonl")
    [record] = [r for r in sqs_event(aws)["Records"] if "TestEvent" not in r["body"]]
    record["messageAttributes"] = {  # it waited for the quota 1 h 2 min before its job started
        "SluiceWaits": {"stringValue": "9", "dataType": "Number"},
        "SluiceWaitingSince": {"stringValue": str(time.time() - 3720), "dataType": "Number"},
    }
    assert start({"Records": [record]}) == {"batchItemFailures": []}
    [job] = jobs(aws)
    done = finished(fail(job, CAPACITY))
    assert done["report"].endswith("/_FAILURE.json") and "waiting" not in done
    assert reports(aws, job["TransformJobName"]) == ["_FAILURE.json"] and delayed(aws) == 0
    [note] = notifications(aws)
    assert note["reason"] == CAPACITY


def test_other_events_are_ignored(aws):
    job = started_job(aws)
    assert finished(state_change(job, "InProgress"))["action"] == "ignored"


def with_version(record: dict, version: str, sequencer: str) -> dict:
    """The same S3 event as another version of the key, with S3's sequencer for it."""
    body = json.loads(record["body"])
    obj = body["Records"][0]["s3"]["object"]
    obj["versionId"], obj["sequencer"] = version, sequencer
    return {**record, "messageId": str(uuid.uuid4()), "body": json.dumps(body)}


def test_an_older_event_arriving_after_a_newer_one_starts_no_work(aws):
    """S3 does not order its notifications: v1's event may come after v2's. A job reads the
    key's current content, so v1's event would only transform v2 again."""
    upload(aws, "incoming/x.jsonl")
    record = next(r for r in sqs_event(aws)["Records"] if "x.jsonl" in r["body"])
    v1 = with_version(record, "v1", "0055AED6DCD90281E5")
    v2 = with_version(record, "v2", "0055AED6DCD90281E6")
    assert start({"Records": [v2]}) == {"batchItemFailures": []}
    assert len(jobs(aws)) == 1
    assert start({"Records": [v1]}) == {"batchItemFailures": []}  # acknowledged, not retried
    assert len(jobs(aws)) == 1
    # the report says what happened to it, and which job has the newer content
    [job] = jobs(aws)
    listed = aws["s3"].list_objects_v2(Bucket=BUCKET, Prefix="outputs/_superseded/")["Contents"]
    [report] = [
        json.loads(aws["s3"].get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()) for o in listed
    ]
    assert report["status"] == "Superseded" and report["input"] == "incoming/x.jsonl"
    assert report["version"] == "v1" and report["newer"].endswith("@v2")
    assert report["job"] == job["TransformJobName"]
    # both in one batch, older last: one job, over the newer event
    upload(aws, "incoming/y.jsonl")
    record = next(r for r in sqs_event(aws)["Records"] if "y.jsonl" in r["body"])
    newer = with_version(record, "v2", "00A1")
    older = with_version(record, "v1", "009F")
    start({"Records": [newer, older]})
    assert len(jobs(aws)) == 2
    y_job = next(j for j in jobs(aws) if "y.jsonl" in str(manifest_keys(aws, j)))
    assert manifest_keys(aws, y_job) == [f"s3://{BUCKET}/incoming/y.jsonl"]  # once, not twice
