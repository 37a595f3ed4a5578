"""Pure logic of the batch path: which uploads to transform, how to group them, what to ask for.

No AWS calls here: handlers parse events, call these functions, and send what they return.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote_plus, unquote_plus

from aws_lambda_powertools.utilities.data_classes import S3Event

from .instances import has_local_storage, is_gpu

JOB_NAME_MAX = 63  # SageMaker: ^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$
JOB_NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


@dataclass(frozen=True)
class Upload:
    """One object to transform, from one SQS message."""

    message_id: str
    bucket: str
    key: str
    size: int
    etag: str
    version_id: str | None = None
    sequencer: str | None = None  # S3's order of events on this key (hex; greater is later)

    @property
    def identity(self) -> str:
        """What makes this upload unique: the object and its version (or content tag)."""
        return f"{self.bucket}/{self.key}@{self.version_id or self.etag}"

    @property
    def location(self) -> str:
        return f"{self.bucket}/{self.key}"

    def record(self) -> dict:
        """What a job's uploads file keeps of it (uploads_key): enough to notify it again."""
        return {k: v for k, v in asdict(self).items() if k != "message_id"}

    def notification(self, region: str) -> str:
        """An S3 event notification of this upload, as S3 writes one to SQS (User Guide, "Event
        message structure"; parse_message reads it back to this Upload): what a job that found
        no capacity sends back to the queue for its uploads."""
        obj = {"key": quote_plus(self.key, safe="/"), "size": self.size, "eTag": self.etag}
        if self.version_id:
            obj["versionId"] = self.version_id
        if self.sequencer:
            obj["sequencer"] = self.sequencer
        record = {
            "eventVersion": "2.1",
            "eventSource": "aws:s3",
            "awsRegion": region,
            "eventTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
            "eventName": "ObjectCreated:Put",
            "s3": {
                "s3SchemaVersion": "1.0",
                "bucket": {"name": self.bucket, "arn": f"arn:aws:s3:::{self.bucket}"},
                "object": obj,
            },
        }
        return json.dumps({"Records": [record]})


SEQUENCER_WIDTH = 64


def sequencer_order(sequencer: str) -> str:
    """A sequencer comparable as a string. S3's User Guide ("Event message structure"): values
    differ in length; right-pad the shorter with zeros, then compare lexicographically."""
    return sequencer.upper().ljust(SEQUENCER_WIDTH, "0")


def newest_per_key(uploads: list[Upload]) -> tuple[list[Upload], list[tuple[Upload, Upload]]]:
    """Within one batch, the latest event of each key (by sequencer) and the (older, newer)
    pairs it supersedes: a job reads a key's current content, so an older event adds nothing."""
    latest: dict[str, Upload] = {}
    for u in uploads:
        seen = latest.get(u.location)
        if seen is None or (
            u.sequencer
            and seen.sequencer
            and sequencer_order(u.sequencer) > sequencer_order(seen.sequencer)
        ):
            latest[u.location] = u
    kept = [u for u in uploads if latest[u.location] is u]
    superseded = [(u, latest[u.location]) for u in uploads if latest[u.location] is not u]
    return kept, superseded


@dataclass
class Skip:
    message_id: str
    reason: str
    key: str | None = None


@dataclass
class Parsed:
    uploads: list[Upload] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    malformed: list[Skip] = field(default_factory=list)


@dataclass(frozen=True)
class Settings:
    """What the start_transform function is configured with (its environment)."""

    stage: str
    bucket: str
    incoming_prefix: str = "incoming/"
    suffixes: tuple[str, ...] = (".jsonl", ".json", ".txt", ".csv")
    max_files: int = 1000
    max_bytes: int = 5 * 2**30
    role_arn: str = ""
    kms_key_arn: str = ""
    instance_type: str = "ml.g5.xlarge"
    instance_count: int = 1
    # the host image of GPU instances: its NVIDIA driver must run the image's CUDA (container.md)
    transform_ami: str = "al2-ami-sagemaker-batch-gpu-535"
    max_payload_mb: int = 1
    max_concurrent: int = 0  # 0: ask the container (/execution-parameters)
    invocation_timeout_s: int = 3600
    invocation_retries: int = 1
    content_type: str = "application/jsonlines"
    accept: str = "application/jsonlines"
    join_source: str = "None"
    task: str = "generate"
    parameters: str = "{}"
    capture: bool = True
    # work that cannot start yet (a quota, throttling) goes back to this queue (waiting.py)
    queue_url: str = ""
    wait_first_s: int = 60
    max_wait_s: float = 24 * 3600.0

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Settings:
        def csv(name: str) -> tuple[str, ...]:
            return tuple(x.strip() for x in env.get(name, "").split(",") if x.strip())

        return cls(
            stage=env["STAGE"],
            bucket=env["DATA_BUCKET"],
            incoming_prefix=env.get("INCOMING_PREFIX", cls.incoming_prefix),
            suffixes=csv("INPUT_SUFFIXES") or cls.suffixes,
            max_files=int(env.get("MAX_FILES_PER_JOB", cls.max_files)),
            max_bytes=int(env.get("MAX_BYTES_PER_JOB", cls.max_bytes)),
            role_arn=env.get("SAGEMAKER_ROLE_ARN", cls.role_arn),
            kms_key_arn=env.get("KMS_KEY_ARN", cls.kms_key_arn),
            instance_type=env.get("TRANSFORM_INSTANCE_TYPE", cls.instance_type),
            instance_count=int(env.get("TRANSFORM_INSTANCE_COUNT", cls.instance_count)),
            transform_ami=env.get("TRANSFORM_AMI_VERSION", cls.transform_ami),
            max_payload_mb=int(env.get("MAX_PAYLOAD_MB", cls.max_payload_mb)),
            max_concurrent=int(env.get("MAX_CONCURRENT_TRANSFORMS", cls.max_concurrent)),
            invocation_timeout_s=int(
                env.get("INVOCATION_TIMEOUT_SECONDS", cls.invocation_timeout_s)
            ),
            invocation_retries=int(env.get("INVOCATION_MAX_RETRIES", cls.invocation_retries)),
            content_type=env.get("CONTENT_TYPE", cls.content_type),
            accept=env.get("ACCEPT", cls.accept),
            join_source=env.get("JOIN_SOURCE", cls.join_source),
            task=env.get("DEFAULT_TASK", cls.task),
            parameters=env.get("DEFAULT_PARAMETERS") or cls.parameters,
            capture=env.get("DATA_CAPTURE", str(cls.capture)).lower() == "true",
            queue_url=env.get("INCOMING_QUEUE_URL", cls.queue_url),
            wait_first_s=int(env.get("QUOTA_RETRY_SECONDS", cls.wait_first_s)),
            max_wait_s=float(env.get("MAX_WAIT_HOURS", cls.max_wait_s / 3600)) * 3600,
        )


# --- parsing ----------------------------------------------------


def parse_message(message_id: str, body: str, settings: Settings, parsed: Parsed) -> None:
    """Add the uploads of one SQS message (an S3 event notification) to `parsed`.

    Skips (each with its reason): S3's test event, other event types, folder markers, empty
    objects, keys outside the incoming prefix or the configured suffixes. A body that is not an S3
    notification at all is malformed: logged and acknowledged, never retried forever.
    """
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, TypeError):
        parsed.malformed.append(Skip(message_id, "message body is not JSON"))
        return
    if not isinstance(doc, dict):
        parsed.malformed.append(Skip(message_id, "message body is not a JSON object"))
        return
    if doc.get("Event") == "s3:TestEvent":
        parsed.skipped.append(Skip(message_id, "s3:TestEvent"))
        return
    if not isinstance(doc.get("Records"), list) or not doc["Records"]:
        parsed.malformed.append(Skip(message_id, "not an S3 event notification (no Records)"))
        return
    try:
        records = list(S3Event(doc).records)
        for rec in records:
            _parse_record(message_id, rec, settings, parsed)
    except (KeyError, TypeError, ValueError) as e:
        parsed.malformed.append(Skip(message_id, f"S3 notification missing a field: {e}"))


def _parse_record(message_id: str, rec, settings: Settings, parsed: Parsed) -> None:
    key = unquote_plus(rec.s3.get_object.key)
    if not rec.event_name.startswith("ObjectCreated:"):
        parsed.skipped.append(Skip(message_id, f"event {rec.event_name}", key))
    elif key.endswith("/"):
        parsed.skipped.append(Skip(message_id, "folder marker", key))
    elif not key.startswith(settings.incoming_prefix):
        parsed.skipped.append(Skip(message_id, f"outside {settings.incoming_prefix}", key))
    elif not key.lower().endswith(tuple(s.lower() for s in settings.suffixes)):
        parsed.skipped.append(Skip(message_id, f"suffix not in {list(settings.suffixes)}", key))
    elif not rec.s3.get_object.size:
        parsed.skipped.append(Skip(message_id, "zero-byte object", key))
    else:
        obj = rec.s3.get_object
        parsed.uploads.append(
            Upload(
                message_id,
                rec.s3.bucket.name,
                key,
                int(obj.size),
                obj.etag or "",
                obj.get("versionId"),
                obj.get("sequencer"),
            )
        )


# --- grouping and naming ----------------------------------------------------


def dedupe(uploads: list[Upload]) -> list[Upload]:
    """One entry per object version (S3 may notify twice; a batch may hold both)."""
    seen, out = set(), []
    for u in uploads:
        if u.identity not in seen:
            seen.add(u.identity)
            out.append(u)
    return out


# A transform job has one ContentType: uploads are grouped by what their suffix says they hold
# (plain text is a prompt a line, not JSON); other suffixes get the configured type (JSON Lines).
CONTENT_TYPES = {".txt": "text/plain", ".csv": "text/csv"}


def content_type(key: str, default: str) -> str:
    """The ContentType a transform job over this object needs."""
    return next((t for s, t in CONTENT_TYPES.items() if key.lower().endswith(s)), default)


def plan_jobs(
    uploads: list[Upload],
    max_files: int,
    max_bytes: int,
    default_type: str = "application/jsonlines",
) -> list[list[Upload]]:
    """Coalesce the batch into as few jobs as the limits allow, one content type a job, in
    arrival order.

    A single object larger than max_bytes still gets a job of its own (it cannot be split).
    """
    by_type: dict[str, list[Upload]] = {}
    for u in uploads:
        by_type.setdefault(content_type(u.key, default_type), []).append(u)
    jobs: list[list[Upload]] = []
    for group in by_type.values():
        current: list[Upload] = []
        size = 0
        for u in group:
            if current and (len(current) >= max_files or size + u.size > max_bytes):
                jobs.append(current)
                current, size = [], 0
            current.append(u)
            size += u.size
        if current:
            jobs.append(current)
    return jobs


def job_name(stage: str, uploads: list[Upload], attempt: int = 0) -> str:
    """Deterministic from the content: the same uploads always give the same name. A later
    attempt (the batch's job failed; SageMaker never reuses a job name) gets its own."""
    text = "\n".join(sorted(u.identity for u in uploads))
    if attempt:
        text += f"\nattempt {attempt}"
    digest = hashlib.sha256(text.encode()).hexdigest()
    prefix = f"sluice-{stage}-"
    name = prefix + digest[: JOB_NAME_MAX - len(prefix)]
    assert JOB_NAME_RE.match(name), name
    return name


def common_prefix(keys: list[str]) -> str:
    """The longest folder prefix (ending in '/') shared by all keys."""
    first, last = min(keys), max(keys)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    return first[:n][: first[:n].rfind("/") + 1]


def manifest(bucket: str, keys: list[str], prefix: str | None = None) -> tuple[str, list]:
    """A SageMaker manifest file: a prefix, then keys relative to it. Batch Transform writes each
    output at that relative path under S3OutputPath, so a fixed `prefix` (the incoming prefix)
    makes an output's key depend on its input's key alone, not on which files share the job;
    without one, the keys' longest common folder."""
    prefix = common_prefix(keys) if prefix is None else prefix
    assert all(k.startswith(prefix) for k in keys), (prefix, keys)
    return prefix, [{"prefix": f"s3://{bucket}/{prefix}"}, *[k[len(prefix) :] for k in keys]]


def uploads_key(name: str) -> str:
    """Beside a job's manifest, its uploads as the events named them (Upload.record) and how
    long they had waited: a job that fails for capacity sends them back to the queue."""
    return f"manifests/{name}.uploads.json"


def job_manifest(settings: Settings, keys: list[str]) -> list:
    """The manifest of one job's uploads, relative to the incoming prefix (predictable outputs)."""
    return manifest(settings.bucket, keys, settings.incoming_prefix)[1]


def output_prefix(settings: Settings, name: str) -> str:
    """Outputs land under outputs/<job>/, at their input's path relative to the incoming prefix:
    incoming/team-a/prompts.jsonl -> outputs/<job>/team-a/prompts.jsonl.out."""
    return f"s3://{settings.bucket}/outputs/{name}/"


def transform_request(
    settings: Settings, model_name: str, name: str, manifest_key: str, uploads: list[Upload]
) -> dict:
    """The CreateTransformJob request for one group of uploads."""
    env = {"SLUICE_TASK": settings.task, "SAGEMAKER_BATCH": "true"}
    params = json.loads(settings.parameters)
    if params:
        env["SLUICE_PARAMETERS"] = json.dumps(params, separators=(",", ":"))
    env["SLUICE_INVOCATION_TIMEOUT"] = str(max(1, settings.invocation_timeout_s - 30))
    payload = settings.max_payload_mb
    if settings.max_concurrent:
        # CreateTransformJob: MaxConcurrentTransforms * MaxPayloadInMB cannot exceed 100 MB
        payload = max(1, min(payload, 100 // settings.max_concurrent))
    req: dict = {
        "TransformJobName": name,
        "ModelName": model_name,
        "BatchStrategy": "MultiRecord",
        "MaxPayloadInMB": payload,
        "ModelClientConfig": {
            "InvocationsTimeoutInSeconds": settings.invocation_timeout_s,
            "InvocationsMaxRetries": settings.invocation_retries,
        },
        "Environment": env,
        "TransformInput": {
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "ManifestFile",
                    "S3Uri": f"s3://{settings.bucket}/{manifest_key}",
                }
            },
            "ContentType": content_type(uploads[0].key, settings.content_type),
            "CompressionType": "None",
            "SplitType": "Line",
        },
        "TransformOutput": {
            "S3OutputPath": output_prefix(settings, name),
            "Accept": settings.accept,
            "AssembleWith": "Line",
        },
        "TransformResources": {
            "InstanceType": settings.instance_type,
            "InstanceCount": settings.instance_count,
        },
        "Tags": job_tags(settings, uploads, manifest_key),
    }
    if settings.max_concurrent:
        req["MaxConcurrentTransforms"] = settings.max_concurrent
    if is_gpu(settings.instance_type) and settings.transform_ami:
        req["TransformResources"]["TransformAmiVersion"] = settings.transform_ami
    if settings.kms_key_arn:
        req["TransformOutput"]["KmsKeyId"] = settings.kms_key_arn
        # SageMaker refuses a volume key where the instance has local storage (it encrypts that
        # in hardware): TransformResources.VolumeKmsKeyId in the API reference
        if not has_local_storage(settings.instance_type):
            req["TransformResources"]["VolumeKmsKeyId"] = settings.kms_key_arn
    if settings.join_source == "Input":
        req["DataProcessing"] = {"JoinSource": "Input"}
    if settings.capture:
        req["DataCaptureConfig"] = {
            "DestinationS3Uri": f"s3://{settings.bucket}/capture/batch/{name}/",
            "GenerateInferenceId": True,
            **({"KmsKeyId": settings.kms_key_arn} if settings.kms_key_arn else {}),
        }
    return req


def job_tags(settings: Settings, uploads: list[Upload], manifest_key: str) -> list[dict]:
    """Tags that lead from a job to its sources: the stage, the number of files and the manifest
    that lists them (the job's report names them too). Object keys themselves are no tag values:
    SageMaker's TagValue pattern has no comma and keys may hold any character."""
    return [
        {"Key": "sluice:stage", "Value": settings.stage},
        {"Key": "sluice:files", "Value": str(len(uploads))},
        {"Key": "sluice:manifest", "Value": f"s3://{settings.bucket}/{manifest_key}"},
    ]
