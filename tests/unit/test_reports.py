from sluice_functions.prices import TRANSFORM_USD_PER_HOUR, job_cost
from sluice_functions.reports import Counts, count_lines, duration_s, report_key, success_report


def test_report_keys_sit_beside_the_outputs():
    assert report_key("s3://b/outputs/job-1/", True) == "outputs/job-1/_SUCCESS.json"
    assert report_key("s3://b/outputs/job-1", False) == "outputs/job-1/_FAILURE.json"
    assert report_key("s3://b", True) == "_SUCCESS.json"


def test_line_counts_stream_across_chunk_boundaries():
    body = b'{"a":1}\n{"id":2,"error":{"code":"x"}}\n{"b":3}\n'
    chunks = [body[i : i + 5] for i in range(0, len(body), 5)]
    assert count_lines(chunks) == Counts(records=3, error_lines=1)
    assert count_lines([b'{"a":1}\n{"error": {"code": 1}}']) == Counts(2, 1)


def test_token_usage_is_summed_from_native_and_openai_lines_across_chunks():
    native = b'{"id":1,"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}'
    openai = (
        b'{"custom_id":"a","response":{"status_code":200,"body":{"usage":'
        b'{"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}},"error":null}'
    )
    body = b"\n".join([native, openai, b'{"id":2,"error":{"code":"too_long"}}'])
    chunks = [body[i : i + 9] for i in range(0, len(body), 9)]
    assert count_lines(chunks) == Counts(3, 1, input_tokens=19, output_tokens=35)


def test_a_jobs_cost_is_its_instance_seconds_at_the_tables_price_or_the_override():
    hour = job_cost("ml.g5.xlarge", 3600.0)
    assert hour == {
        "usd": TRANSFORM_USD_PER_HOUR["ml.g5.xlarge"],
        "usd_per_hour": TRANSFORM_USD_PER_HOUR["ml.g5.xlarge"],
        "price": hour["price"],
    }
    assert job_cost("ml.g5.xlarge", 1800.0, "2.5")["usd"] == 1.25
    unknown = job_cost("ml.x9.huge", 60.0)
    assert unknown["usd"] is None and "TransformPricePerHour" in unknown["price"]
    assert job_cost("ml.x9.huge", 60.0, "oops")["usd"] is None  # a bad override is not a price


def test_success_report_from_the_event_detail():
    detail = {
        "TransformJobName": "j",
        "TransformJobStatus": "Completed",
        "ModelName": "m",
        "TransformStartTime": 1_700_000_000_000,
        "TransformEndTime": 1_700_000_090_500,
    }
    files = [{"records": 3, "error_lines": 1}, {"records": 2, "error_lines": 0}]
    r = success_report(detail, ["s3://b/incoming/a"], files)
    assert (r["records"], r["error_lines"], r["duration_s"]) == (5, 1, 90.5)
    assert r["instance_count"] == 1 and r["cost"]["usd"] is None  # no instance type: no price
    detail["TransformResources"] = {"InstanceType": "ml.g4dn.xlarge", "InstanceCount": 2}
    r = success_report(detail, [], files, price_per_hour="1.0")
    assert (r["instance_seconds"], r["cost"]["usd"]) == (181.0, round(181 / 3600, 6))
    assert duration_s({}) is None


def test_iso_8601_times_as_in_aws_samples_give_a_duration_too():
    """SageMaker's documented event samples carry ISO-8601 times; before, duration_s was null."""
    iso = {
        "TransformStartTime": "2019-05-22T21:47:19.000Z",
        "TransformEndTime": "2019-05-22T21:49:02Z",
    }
    assert duration_s(iso) == 103.0
    detail = {**iso, "TransformJobName": "j", "TransformJobStatus": "Completed", "ModelName": "m"}
    r = success_report(detail, [], [])
    assert r["started"] == "2019-05-22T21:47:19+00:00"
    mixed = {"TransformStartTime": "2023-11-14T22:13:20Z", "TransformEndTime": 1_700_000_090_500}
    assert duration_s(mixed) == 90.5
    assert duration_s({"TransformStartTime": "yesterday", "TransformEndTime": 1}) is None


def test_a_notification_fits_sns_whatever_the_jobs_size():
    """SNS refuses a message of 256 KB or more (InvalidParameter): a job of a thousand files
    lost its notification (benchmarks.scale). Its lists stay in the report then."""
    import json

    from sluice_functions.reports import SNS_MAX_BYTES, notification

    detail = {"TransformJobName": "j", "TransformJobStatus": "Completed", "ModelName": "m"}
    for n, whole in ((3, True), (2000, False)):
        inputs = [f"s3://bucket/incoming/team/{i:06d}.jsonl" for i in range(n)]
        files = [
            {"input": u, "output": u.replace("incoming", "outputs/j") + ".out", "records": 1}
            for u in inputs
        ]
        _, message = notification(success_report(detail, inputs, files), "s3://b/r.json")
        assert len(message.encode()) <= SNS_MAX_BYTES
        sent = json.loads(message[message.index("{") :])
        assert ("inputs" in sent) is whole and sent.get("inputs_count", n) == n
