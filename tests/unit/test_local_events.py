"""Pure parts of the local stack's event machinery: schedule expressions, SQS records, patterns."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sluice_local.events import cron_matches, rate_seconds, sqs_record


def test_aws_cron_expressions():
    hourly = "cron(5 * * * ? *)"  # the template's monitoring window schedule
    assert cron_matches(hourly, datetime(2026, 12, 2, 10, 5, tzinfo=UTC))
    assert not cron_matches(hourly, datetime(2026, 12, 2, 10, 6, tzinfo=UTC))
    daily = "cron(5 0 * * ? *)"
    assert cron_matches(daily, datetime(2026, 12, 2, 0, 5, tzinfo=UTC))
    assert not cron_matches(daily, datetime(2026, 12, 2, 1, 5, tzinfo=UTC))
    weekdays = "cron(0/15 8-17 ? * MON-FRI *)"
    assert cron_matches(weekdays, datetime(2026, 12, 2, 9, 30, tzinfo=UTC))  # a Wednesday
    assert not cron_matches(weekdays, datetime(2026, 12, 6, 9, 30, tzinfo=UTC))  # a Sunday
    assert not cron_matches(weekdays, datetime(2026, 12, 2, 9, 31, tzinfo=UTC))
    with pytest.raises(ValueError, match="six fields"):
        cron_matches("cron(5 * * *)", datetime.now(UTC))
    with pytest.raises(ValueError, match="not supported"):
        cron_matches("cron(0 0 L * ? *)", datetime.now(UTC))


def test_rate_expressions():
    assert rate_seconds("rate(5 minutes)") == 300
    assert rate_seconds("rate(1 hour)") == 3600
    assert rate_seconds("rate(7 days)") == 7 * 86400
    with pytest.raises(ValueError):
        rate_seconds("rate(5 fortnights)")


def test_sqs_messages_become_lambdas_sqs_records():
    msg = {
        "MessageId": "m1",
        "ReceiptHandle": "r",
        "Body": "{}",
        "MD5OfBody": "x",
        "Attributes": {"ApproximateReceiveCount": "2", "SentTimestamp": "1"},
        "MessageAttributes": {"a": {"DataType": "String", "StringValue": "v"}},
    }
    rec = sqs_record(msg, "arn:aws:sqs:us-east-1:123456789012:q")
    assert rec["messageId"] == "m1" and rec["eventSource"] == "aws:sqs"
    assert rec["attributes"]["ApproximateReceiveCount"] == "2"
    assert rec["messageAttributes"]["a"]["stringValue"] == "v"
    from aws_lambda_powertools.utilities.data_classes import SQSEvent

    parsed = next(iter(SQSEvent({"Records": [rec]}).records))  # what the handlers read
    assert parsed.attributes.approximate_receive_count == "2" and parsed.body == "{}"
