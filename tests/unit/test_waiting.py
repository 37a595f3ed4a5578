"""What may wait for capacity and for how long (sluice_functions.waiting), and the local
SageMaker's account quotas (sluice_local.sagemaker.quotas) that answer as SageMaker does."""

from __future__ import annotations

import pytest

from sluice_functions import waiting
from sluice_local.sagemaker import quotas
from sluice_local.sagemaker.shapes import ApiError

# SageMaker's own words (seen on AWS for training jobs; the same sentence for every usage quota)
AWS_MESSAGE = (
    "The account-level service limit 'ml.p3.8xlarge for training job usage' is 2 Instances, with "
    "current utilization of 3 Instances and a request delta of 1 Instances. Please contact AWS "
    "support to request an increase for this limit."
)


def test_sagemakers_quota_message_is_read():
    q = waiting.quota(AWS_MESSAGE)
    assert q == waiting.Quota("ml.p3.8xlarge for training job usage", 2, 3, 1)
    assert not q.never_fits
    assert waiting.why_waiting_cannot_help("ResourceLimitExceeded", AWS_MESSAGE) is None
    zero = AWS_MESSAGE.replace("is 2 Instances", "is 0 Instances")
    why = waiting.why_waiting_cannot_help("ResourceLimitExceeded", zero)
    assert "quota 'ml.p3.8xlarge for training job usage' is 0" in why
    # a quota message worded otherwise still waits (bounded by MaxWaitHours)
    assert waiting.why_waiting_cannot_help("ResourceLimitExceeded", "too many jobs") is None
    assert waiting.why_waiting_cannot_help("ThrottlingException", "Rate exceeded") is None
    assert waiting.why_waiting_cannot_help("ValidationException", "bad").startswith("Validation")


def test_the_delay_doubles_up_to_sixteen_times_and_sqs_maximum():
    assert [round(waiting.delay_s(w, 60) / 60) for w in range(3)] in ([1, 2, 4], [1, 2, 3])
    assert all(waiting.delay_s(w, 60) <= 900 for w in range(20))
    assert max(waiting.delay_s(9, 2) for _ in range(50)) <= 32  # 16x the first wait
    assert min(waiting.delay_s(0, 1) for _ in range(50)) == 1  # SQS counts whole seconds


def test_waiting_state_from_message_attributes():
    fresh = waiting.Waiting.of({}, now=100.0)
    assert fresh == waiting.Waiting(0, 100.0) and not fresh.expired(100.0, 3600)
    attrs = fresh.next_attributes()
    assert attrs["SluiceWaits"] == {"DataType": "Number", "StringValue": "1"}
    lambda_shape = {k: {"stringValue": v["StringValue"]} for k, v in attrs.items()}
    again = waiting.Waiting.of(lambda_shape, now=5000.0)
    assert again == waiting.Waiting(1, 100.0) and again.expired(5000.0, 3600)
    assert waiting.Waiting.of({"SluiceWaits": {"stringValue": "x"}}, 7.0) == waiting.Waiting(0, 7.0)


def transform(instance_type: str = "ml.g5.xlarge", count: int = 1) -> dict:
    return {"TransformResources": {"InstanceType": instance_type, "InstanceCount": count}}


def test_local_quotas_refuse_as_sagemaker_does():
    limits = {"ml.g5.xlarge for transform job usage": 1}
    quotas.check("TransformJob", transform(), [], limits)
    with pytest.raises(ApiError) as e:
        quotas.check("TransformJob", transform(), [transform()], limits)
    assert e.value.code == "ResourceLimitExceeded" and e.value.status == 400
    assert waiting.quota(e.value.message) == waiting.Quota(
        "ml.g5.xlarge for transform job usage", 1, 1, 1
    )
    quotas.check("TransformJob", transform("ml.m5.xlarge"), [transform()], limits)
    # unnamed: transform 2 of each type; training unlimited
    quotas.check("TransformJob", transform("ml.m5.xlarge"), [transform("ml.m5.xlarge")], {})
    with pytest.raises(ApiError):
        quotas.check("TransformJob", transform("ml.m5.xlarge", 3), [], {})
    training = {"ResourceConfig": {"InstanceType": "ml.g5.xlarge", "InstanceCount": 8}}
    quotas.check("TrainingJob", training, [training] * 4, {})


def test_quota_flags_are_parsed_or_refused():
    assert quotas.parse(["ml.g5.xlarge for transform job usage=1"]) == {
        "ml.g5.xlarge for transform job usage": 1
    }
    for bad in ("ml.g5.xlarge=1", "ml.g5.xlarge for transform job usage=one"):
        with pytest.raises(ValueError, match="expected '<instance type> for"):
            quotas.parse([bad])


def test_a_waiting_batch_is_sent_back_with_one_delay_so_it_comes_back_as_one_batch():
    """Jittered per message, a burst of 40 uploads came back one by one over the delay's last
    fifth and became 18 transform jobs at quota 1 (the e2e quota test); with one delay per
    batch it stays one job. The delay follows the longest wait in the batch."""
    items = [(f"body-{i}", waiting.Waiting(i % 3, 100.0)) for i in range(40)]
    for _ in range(20):
        entries = waiting.resend_entries(items, 60)
        assert len({e["DelaySeconds"] for e in entries}) == 1
        assert 0.8 * 240 <= entries[0]["DelaySeconds"] <= 240  # waits 2: 60 s x 2^2
    assert [e["Id"] for e in entries] == [str(i) for i in range(40)]
    assert [e["MessageBody"] for e in entries] == [b for b, _ in items]
    assert entries[4]["MessageAttributes"]["SluiceWaits"]["StringValue"] == "2"
    assert waiting.resend_entries([], 60) == []


def test_a_job_that_found_no_capacity_is_told_from_other_failures():
    """SageMaker's FailureReason begins with CapacityError (AWS Batch User Guide, "Jobs stuck in
    RUNNABLE due to capacity"); the local SageMaker fails such jobs with the same words."""
    assert waiting.is_capacity_failure(quotas.CAPACITY_ERROR)
    for other in (None, "", "ClientError: model container failed a ping", "AlgorithmError: x"):
        assert not waiting.is_capacity_failure(other)


def test_a_job_records_its_uploads_longest_wait_and_an_upload_is_notified_again_as_s3_does():
    from sluice_functions.batching import Parsed, Settings, Upload, parse_message

    states = [waiting.Waiting(2, 500.0), waiting.Waiting(0, 900.0)]
    job = waiting.Waiting.of_all(states, now=1000.0)
    assert job == waiting.Waiting(2, 500.0)
    assert waiting.Waiting.from_record(job.record(), now=1000.0) == job
    assert waiting.Waiting.of_all([], now=7.0) == waiting.Waiting(0, 7.0)
    upload = Upload("m", "b", "incoming/team a/x+1 é.jsonl", 12, "e1", "v1", "00AB")
    settings = Settings(stage="dev", bucket="b")
    parsed = Parsed()
    parse_message("m2", upload.notification("us-east-1"), settings, parsed)
    assert parsed.uploads == [Upload("m2", **upload.record())]
    bare = Upload("m", "b", "incoming/y.txt", 3, "e2")  # no versioning, no sequencer
    parse_message("m3", bare.notification("us-east-1"), settings, parsed)
    assert parsed.uploads[-1] == Upload("m3", **bare.record())


def test_the_local_sagemaker_finds_no_capacity_for_the_jobs_it_is_told(tmp_path):
    from sluice_local.sagemaker.api import LocalSageMaker

    assert quotas.parse_capacity(["ml.g5.xlarge=2"]) == {"ml.g5.xlarge": 2}
    with pytest.raises(ValueError, match="expected '<instance type>=<jobs>'"):
        quotas.parse_capacity(["g5=1"])
    api = LocalSageMaker(tmp_path, lambda *_: None, no_capacity={"ml.g5.xlarge": 2})
    took = [api.finds_no_capacity("ml.g5.xlarge") for _ in range(3)]
    assert took == [True, True, False] and not api.finds_no_capacity("ml.m5.xlarge")
