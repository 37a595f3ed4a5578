"""A burst of uploads: transform jobs Sluice starts vs one job per upload.

1000 uploads land within one batching window. S3 notifies the queue (moto), and the queue is
drained the way Lambda's SQS poller does it: several pollers in parallel (5 at first, the
function's reserved concurrency here), each gathering messages 10 at a time until its batch is
full or the window closes. Every batch goes through the real start_transform handler.

Instance-start minutes: each transform job pays its instances' start-up (provisioning, image pull,
model load) before it processes a record; `--startup-minutes` (default 6, an estimate for a GPU
instance and a multi-GB image) times jobs times instances is the time saved.

    python -m benchmarks.burst [--uploads 1000] [--pollers 5] [--batch-size 1000]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import boto3
from moto import mock_aws

REGION, BUCKET = "us-east-1", "sluice-bench-data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uploads", type=int, default=1000)
    ap.add_argument("--pollers", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--startup-minutes", type=float, default=6.0)
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/burst.json")
    args = ap.parse_args()
    os.environ.update(
        {
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "x",
            "STAGE": "bench",
            "DATA_BUCKET": BUCKET,
            "MODEL_PARAMETER": "/sluice/bench/model",
            "SAGEMAKER_ROLE_ARN": "arn:aws:iam::123456789012:role/sm",
            "POWERTOOLS_METRICS_NAMESPACE": "Sluice",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
        }
    )
    with mock_aws():
        from sluice_functions import start_transform

        s3, sqs = boto3.client("s3"), boto3.client("sqs")
        sm = boto3.client("sagemaker")
        s3.create_bucket(Bucket=BUCKET)
        url = sqs.create_queue(QueueName="incoming")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        s3.put_bucket_notification_configuration(
            Bucket=BUCKET,
            NotificationConfiguration={
                "QueueConfigurations": [
                    {
                        "QueueArn": arn,
                        "Events": ["s3:ObjectCreated:*"],
                        "Filter": {
                            "Key": {"FilterRules": [{"Name": "prefix", "Value": "incoming/"}]}
                        },
                    }
                ]
            },
        )
        sm.create_model(
            ModelName="m",
            ExecutionRoleArn="arn:aws:iam::123456789012:role/sm",
            PrimaryContainer={"Image": "sluice"},
        )
        boto3.client("ssm").put_parameter(Name="/sluice/bench/model", Value="m", Type="String")
        for i in range(args.uploads):
            s3.put_object(
                Bucket=BUCKET,
                Key=f"incoming/user-{i % 37}/file-{i}.jsonl",
                Body=b'{"text": "hello"}\n',
            )

        # the pollers take turns receiving 10 at a time until the queue is empty
        batches: list[list[dict]] = [[] for _ in range(args.pollers)]
        turn = 0
        while True:
            got = sqs.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"]
            ).get("Messages", [])
            if not got:
                break
            batches[turn % args.pollers] += got
            turn += 1
            # taken by a poller: out of the queue (moto scans every message on each receive)
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(k), "ReceiptHandle": m["ReceiptHandle"]} for k, m in enumerate(got)
                ],
            )
        invocations = []
        for b in batches:
            for s in range(0, len(b), args.batch_size):
                invocations.append(b[s : s + args.batch_size])
        for batch in invocations:
            event = {
                "Records": [
                    {
                        "messageId": m["MessageId"],
                        "receiptHandle": m["ReceiptHandle"],
                        "body": m["Body"],
                        "attributes": {**m["Attributes"], "ApproximateReceiveCount": "1"},
                        "messageAttributes": {},
                        "md5OfBody": m["MD5OfBody"],
                        "eventSource": "aws:sqs",
                        "eventSourceARN": arn,
                        "awsRegion": REGION,
                    }
                    for m in batch
                ]
            }
            failures = start_transform.handler(event, _Context())["batchItemFailures"]
            assert not failures, failures
        jobs = len(sm.list_transform_jobs(MaxResults=100)["TransformJobSummaries"])
    saved = (args.uploads - jobs) * args.startup_minutes * args.instances
    result = {
        "uploads": args.uploads,
        "pollers": args.pollers,
        "invocations": len(invocations),
        "jobs_sluice": jobs,
        "jobs_one_per_upload": args.uploads,
        "ratio": args.uploads / jobs,
        "startup_minutes_per_job": args.startup_minutes,
        "instance_minutes_saved": saved,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{args.uploads} uploads in one window, {args.pollers} pollers, "
        f"{len(invocations)} invocations"
    )
    print(
        f"transform jobs: Sluice {jobs}, one per upload {args.uploads} "
        f"({args.uploads / jobs:.0f}x fewer)"
    )
    print(
        f"instance start-up saved: {saved:.0f} instance-minutes ({saved / 60:.1f} h) at "
        f"{args.startup_minutes:g} min per job start"
    )


class _Context:
    function_name = "sluice-bench-start-transform"
    memory_limit_in_mb = 256
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:bench"
    aws_request_id = "bench"

    def get_remaining_time_in_millis(self) -> int:
        return 60_000


if __name__ == "__main__":
    main()
