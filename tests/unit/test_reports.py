from sluice_functions.reports import count_lines, duration_s, report_key, success_report


def test_report_keys_sit_beside_the_outputs():
    assert report_key("s3://b/outputs/job-1/", True) == "outputs/job-1/_SUCCESS.json"
    assert report_key("s3://b/outputs/job-1", False) == "outputs/job-1/_FAILURE.json"
    assert report_key("s3://b", True) == "_SUCCESS.json"


def test_line_counts_stream_across_chunk_boundaries():
    body = b'{"a":1}\n{"id":2,"error":{"code":"x"}}\n{"b":3}\n'
    chunks = [body[i : i + 5] for i in range(0, len(body), 5)]
    assert count_lines(chunks) == (3, 1)
    assert count_lines([b'{"a":1}\n{"error": {"code": 1}}']) == (2, 1)


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
    assert duration_s({}) is None
