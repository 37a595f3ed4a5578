"""Pure builders of the batch path: parsing, grouping, naming, manifests, the request itself."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sluice_functions.batching import (
    JOB_NAME_RE,
    Parsed,
    Settings,
    Upload,
    dedupe,
    job_manifest,
    job_name,
    job_tags,
    manifest,
    parse_message,
    plan_jobs,
    transform_request,
)
from sluice_local.validation import request_problems

SETTINGS = Settings(
    stage="dev",
    bucket="sluice-dev-data",
    role_arn="arn:aws:iam::123456789012:role/r",
    kms_key_arn="arn:aws:kms:us-east-1:123456789012:key/k",
    join_source="Input",
    parameters='{"max_new_tokens": 64}',
)


def s3_event(key: str, size: int = 10, event: str = "ObjectCreated:Put", etag="e1") -> str:
    return json.dumps(
        {
            "Records": [
                {
                    "eventVersion": "2.1",
                    "eventSource": "aws:s3",
                    "awsRegion": "us-east-1",
                    "eventName": event,
                    "s3": {
                        "bucket": {"name": "sluice-dev-data"},
                        "object": {"key": key, "size": size, "eTag": etag},
                    },
                }
            ]
        }
    )


def parse(*bodies: str) -> Parsed:
    parsed = Parsed()
    for i, b in enumerate(bodies):
        parse_message(f"m{i}", b, SETTINGS, parsed)
    return parsed


def test_keys_are_decoded_and_skips_have_reasons():
    p = parse(
        s3_event("incoming/my+file%C3%BC.jsonl"),
        json.dumps({"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "b"}),
        s3_event("incoming/folder/", size=0),
        s3_event("incoming/empty.jsonl", size=0),
        s3_event("incoming/image.png"),
        s3_event("outputs/x.jsonl"),
        s3_event("incoming/x.jsonl", event="ObjectRemoved:Delete"),
        "not json",
        json.dumps({"hello": 1}),
    )
    assert [u.key for u in p.uploads] == ["incoming/my fileü.jsonl"]
    assert [s.reason for s in p.skipped] == [
        "s3:TestEvent",
        "folder marker",
        "zero-byte object",
        "suffix not in ['.jsonl', '.json', '.txt', '.csv']",
        "outside incoming/",
        "event ObjectRemoved:Delete",
    ]
    assert [m.message_id for m in p.malformed] == ["m7", "m8"]


def upload(i: int, size: int = 100, key: str = "") -> Upload:
    return Upload(f"m{i}", "b", key or f"incoming/f{i}.jsonl", size, f"e{i}")


def test_one_job_per_batch_split_only_by_the_limits():
    ups = [upload(i) for i in range(10)]
    assert len(plan_jobs(ups, 1000, 10**9)) == 1
    assert [len(g) for g in plan_jobs(ups, 4, 10**9)] == [4, 4, 2]
    assert [len(g) for g in plan_jobs(ups, 1000, 250)] == [2, 2, 2, 2, 2]
    assert [len(g) for g in plan_jobs([upload(0, 10**6)], 1000, 10)] == [1]  # too big: alone


def test_plain_text_and_csv_uploads_get_jobs_of_their_own_content_type():
    ups = [
        upload(0),
        Upload("m1", "b", "incoming/notes.TXT", 10, "e"),
        upload(2),
        Upload("m3", "b", "incoming/t.csv", 10, "e"),
    ]
    jobs = plan_jobs(ups, 1000, 10**9)
    assert [[u.message_id for u in g] for g in jobs] == [["m0", "m2"], ["m1"], ["m3"]]
    types = [
        transform_request(SETTINGS, "m", job_name("dev", g), "k", g)["TransformInput"][
            "ContentType"
        ]
        for g in jobs
    ]
    assert types == ["application/jsonlines", "text/plain", "text/csv"]


def test_job_names_are_deterministic_valid_and_order_free():
    ups = [upload(i) for i in range(5)]
    name = job_name("dev", ups)
    assert name == job_name("dev", list(reversed(ups)))
    assert name != job_name("dev", ups[:4])
    assert len(name) <= 63 and JOB_NAME_RE.match(name) and name.startswith("sluice-dev-")
    changed = [*ups[:4], Upload("m4", "b", ups[4].key, 100, "other-etag")]
    assert job_name("dev", changed) != name  # a re-upload of the same key is a new job


def test_duplicate_notifications_are_one_upload():
    ups = [upload(1), upload(1), upload(2)]
    assert [u.key for u in dedupe(ups)] == ["incoming/f1.jsonl", "incoming/f2.jsonl"]


def test_manifest_keeps_paths_relative_to_the_common_folder():
    prefix, body = manifest("b", ["incoming/a/x.jsonl", "incoming/a/y/z.jsonl", "incoming/b.txt"])
    assert prefix == "incoming/"
    assert body == [{"prefix": "s3://b/incoming/"}, "a/x.jsonl", "a/y/z.jsonl", "b.txt"]


class ManifestOnly:
    """The one object the local Batch Transform reads to place outputs: the manifest."""

    def __init__(self, body: list):
        self.body = json.dumps(body).encode()

    def read(self, uri: str) -> bytes:
        return self.body


@pytest.mark.parametrize(
    "keys",
    [
        ["incoming/team-a/prompts.jsonl"],
        ["incoming/team-a/prompts.jsonl", "incoming/team-a/more.jsonl"],
        ["incoming/team-a/prompts.jsonl", "incoming/team-b/x/y.jsonl", "incoming/top.jsonl"],
    ],
    ids=["one-file", "one-folder", "two-folders"],
)
def test_an_outputs_key_depends_on_its_inputs_key_alone(keys):
    """incoming/<path> -> outputs/<job>/<path>.out, whichever files share the job: the manifest
    start_transform writes, placed as Batch Transform places outputs (the local one's code)."""
    from sluice_local.transform import join, resolve_inputs

    ups = [Upload(f"m{i}", SETTINGS.bucket, k, 10, "e") for i, k in enumerate(keys)]
    name = job_name("dev", ups)
    request = transform_request(SETTINGS, "model", name, f"manifests/{name}.json", ups)
    body = job_manifest(SETTINGS, keys)
    out = request["TransformOutput"]["S3OutputPath"]
    placed = [join(out, rel + ".out") for _, rel in resolve_inputs(ManifestOnly(body), "", True)]
    expected = [f"s3://{SETTINGS.bucket}/outputs/{name}/{k[len('incoming/') :]}.out" for k in keys]
    assert placed == expected


def validate(operation: str, params: dict) -> None:
    """As botocore checks it before sending, then as SageMaker checks it on its side."""
    found = request_problems("sagemaker", operation, params)
    assert not found, found


def test_the_request_matches_botocores_service_model_and_asks_for_the_right_things():
    ups = [upload(i) for i in range(3)]
    name = job_name("dev", ups)
    req = transform_request(SETTINGS, "sluice-model-1", name, f"manifests/{name}.json", ups)
    validate("CreateTransformJob", req)
    assert req["TransformInput"]["DataSource"]["S3DataSource"]["S3DataType"] == "ManifestFile"
    assert req["TransformInput"]["SplitType"] == "Line"
    assert req["BatchStrategy"] == "MultiRecord"
    assert req["TransformOutput"]["AssembleWith"] == "Line"
    assert req["DataProcessing"] == {"JoinSource": "Input"}
    assert req["TransformOutput"]["KmsKeyId"] == SETTINGS.kms_key_arn
    # ml.g5 has local NVMe storage: SageMaker refuses a volume key there (hardware-encrypted)
    assert "VolumeKmsKeyId" not in req["TransformResources"]
    # a GPU host whose NVIDIA driver is named (docs/container.md: the image's CUDA needs it)
    assert req["TransformResources"]["TransformAmiVersion"] == "al2-ami-sagemaker-batch-gpu-535"
    assert req["ModelClientConfig"] == {
        "InvocationsTimeoutInSeconds": 3600,
        "InvocationsMaxRetries": 1,
    }
    assert "MaxConcurrentTransforms" not in req  # 0: the container's /execution-parameters
    env = req["Environment"]
    assert env["SLUICE_TASK"] == "generate"
    assert json.loads(env["SLUICE_PARAMETERS"]) == {"max_new_tokens": 64}
    assert int(env["SLUICE_INVOCATION_TIMEOUT"]) < 3600  # the container answers before the cutoff
    assert req["DataCaptureConfig"]["DestinationS3Uri"].startswith("s3://sluice-dev-data/capture/")
    assert req["TransformOutput"]["S3OutputPath"] == f"s3://sluice-dev-data/outputs/{name}/"


@pytest.mark.parametrize("n", [1, 2, 500])
def test_a_coalesced_job_passes_sagemakers_rules_and_its_tags_lead_to_the_manifest(n):
    """A comma-joined list of keys in a tag was refused by SageMaker (TagValue has no comma) for
    every job of two files or more; keys with any characters must not reach a tag either."""
    ups = [upload(i) for i in range(n)] + [upload(n, key="incoming/a,b (1) ü #.jsonl")]
    name = job_name("dev", ups)
    req = transform_request(SETTINGS, "sluice-model-1", name, f"manifests/{name}.json", ups)
    validate("CreateTransformJob", req)
    tags = {t["Key"]: t["Value"] for t in job_tags(SETTINGS, ups, f"manifests/{name}.json")}
    assert tags["sluice:files"] == str(n + 1)
    assert tags["sluice:manifest"] == f"s3://sluice-dev-data/manifests/{name}.json"


def test_sequencers_compare_as_s3_says_after_right_padding():
    """S3: sequencers differ in length; right-pad the shorter with zeros, then compare."""
    from sluice_functions.batching import newest_per_key, sequencer_order

    assert sequencer_order("00A1") > sequencer_order("009F")
    assert sequencer_order("1") > sequencer_order("09")  # "10" > "09" once padded on the right
    assert sequencer_order("0055AED6DCD90281E5") == sequencer_order("0055AED6DCD90281E500")
    from dataclasses import replace

    a = replace(upload(1, key="incoming/k.jsonl"), sequencer="0055AED6DCD90281E6")
    b = replace(upload(2, key="incoming/k.jsonl"), sequencer="0055AED6DCD90281E5")
    kept, older = newest_per_key([b, a, upload(3)])
    assert [u.message_id for u in kept] == ["m1", "m3"] and older == [(b, a)]


@pytest.mark.parametrize(
    ("instance_type", "volume_key", "ami"),
    [
        ("ml.g5.xlarge", False, True),  # local NVMe, GPU
        ("ml.g4dn.xlarge", False, True),
        ("ml.p3.2xlarge", True, True),  # EBS only, GPU
        ("ml.m5.xlarge", True, False),  # EBS only, CPU
        ("ml.trn1.2xlarge", False, False),  # local NVMe, no NVIDIA GPU
    ],
)
def test_the_volume_key_only_where_sagemaker_takes_one(instance_type, volume_key, ami):
    """SageMaker API reference, TransformResources.VolumeKmsKeyId: "You can't request a
    VolumeKmsKeyId when using an instance type with local storage." Every job was refused on the
    default ml.g5.xlarge before."""
    settings = dataclasses.replace(SETTINGS, instance_type=instance_type)
    ups = [upload(0)]
    req = transform_request(settings, "m", job_name("dev", ups), "manifests/m.json", ups)
    validate("CreateTransformJob", req)
    assert ("VolumeKmsKeyId" in req["TransformResources"]) == volume_key
    assert ("TransformAmiVersion" in req["TransformResources"]) == ami


def test_the_rule_set_refuses_a_volume_key_on_local_storage():
    """The local stack refuses what SageMaker refuses (sluice_local.aws_rules), as the request
    built before the fix was."""
    ups = [upload(0)]
    req = transform_request(SETTINGS, "m", job_name("dev", ups), "manifests/m.json", ups)
    req["TransformResources"]["VolumeKmsKeyId"] = SETTINGS.kms_key_arn
    found = request_problems("sagemaker", "CreateTransformJob", req)
    assert any("[volume-key-transform]" in f for f in found), found


@pytest.mark.parametrize(
    ("concurrent", "payload", "sent"), [(8, 20, 12), (4, 25, 25), (0, 100, 100)]
)
def test_payload_times_concurrency_stays_within_100_mb(concurrent, payload, sent):
    """CreateTransformJob: "the value of (MaxConcurrentTransforms * MaxPayloadInMB) also cannot
    exceed 100 MB"; a configured payload above that share is lowered, not refused by AWS."""
    settings = dataclasses.replace(SETTINGS, max_concurrent=concurrent, max_payload_mb=payload)
    ups = [upload(0)]
    req = transform_request(settings, "m", job_name("dev", ups), "manifests/m.json", ups)
    validate("CreateTransformJob", req)
    assert req["MaxPayloadInMB"] == sent
    req["MaxPayloadInMB"] = payload
    refused = request_problems("sagemaker", "CreateTransformJob", req)
    assert bool(refused) == (concurrent * payload > 100), refused
