"""Pure builders for the scheduled drift checks (both MonitoringMode values use the same image).

Processing: every window, one CreateProcessingJob over the capture objects written in that window
(endpoint and batch capture, through a manifest), the champion's tokenizer and its baseline.
ModelMonitor: a monitoring schedule on the endpoint whose bring-your-own-container job is the same
`sluice monitor` entrypoint, pointed at the same baseline. Both write constraint_violations.json
where retrain_trigger reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .batching import manifest
from .instances import has_local_storage
from .reports import parse_manifest

LOCAL = "/opt/ml/processing"
ENTRYPOINT = ["sluice", "monitor"]


@dataclass(frozen=True)
class MonitorSettings:
    """The start_monitor function's configuration (its environment)."""

    stage: str
    bucket: str
    image: str
    role_arn: str
    kms_key_arn: str
    endpoint: str
    instance_type: str = "ml.m5.xlarge"
    window_s: int = 3600
    subnets: tuple[str, ...] = ()
    security_groups: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, env: dict[str, str]) -> MonitorSettings:
        def csv(name: str) -> tuple[str, ...]:
            return tuple(x for x in env.get(name, "").split(",") if x)

        return cls(
            stage=env["STAGE"],
            bucket=env["DATA_BUCKET"],
            image=env["IMAGE_URI"],
            role_arn=env["SAGEMAKER_ROLE_ARN"],
            kms_key_arn=env.get("KMS_KEY_ARN", ""),
            endpoint=env["ENDPOINT_NAME"],
            instance_type=env.get("MONITORING_INSTANCE_TYPE", cls.instance_type),
            window_s=int(env.get("MONITORING_WINDOW_SECONDS", cls.window_s)),
            subnets=csv("SUBNET_IDS"),
            security_groups=csv("SECURITY_GROUP_IDS"),
        )


def baseline_prefix(model: str) -> str:
    """Where the baseline for a champion lives: the retrain state machine writes it there."""
    return f"monitoring/baseline/{model}/"


def window_of(now: datetime, window_s: int) -> tuple[datetime, datetime]:
    """The last complete window before `now` (aligned, so every trigger agrees on it)."""
    end_epoch = int(now.timestamp()) // window_s * window_s
    end = datetime.fromtimestamp(end_epoch, now.tzinfo)
    return end - timedelta(seconds=window_s), end


def job_name(stage: str, start: datetime) -> str:
    """One job per window: a second trigger for the same window finds its name taken."""
    return f"sluice-{stage}-monitor-{start:%Y%m%d%H%M}"


def endpoint_capture_prefixes(endpoint: str, start: datetime, end: datetime) -> list[str]:
    """Endpoint capture is partitioned by hour: capture/endpoint/<ep>/<variant>/yyyy/mm/dd/hh/."""
    out, t = [], start.replace(minute=0, second=0, microsecond=0)
    while t < end:
        out.append(f"capture/endpoint/{endpoint}/AllTraffic/{t:%Y/%m/%d/%H}/")
        t += timedelta(hours=1)
    return out


def in_window(last_modified: datetime, start: datetime, end: datetime) -> bool:
    return start <= last_modified < end


def requested_window(event: dict, now: datetime, window_s: int) -> tuple[datetime, datetime]:
    """The window to check: by default the last complete one; `{"end": ISO-8601 | "now"}` (an
    operator checking now, or re-checking a past window) asks for the window_s ending then."""
    end = event.get("end") if isinstance(event, dict) else None
    if not end:
        return window_of(now, window_s)
    when = now if end == "now" else datetime.fromisoformat(str(end).replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=now.tzinfo)
    return when - timedelta(seconds=window_s), when


def batch_capture_keys(bucket: str, body: bytes) -> list[str] | None:
    """The objects a batch capture file names (SageMaker writes manifests of a transform job's
    inputs under input/ and of its outputs under output/, not copies); None if `body` is not
    such a manifest. Objects in other buckets are left out (one job reads one bucket)."""
    try:
        prefix, keys = parse_manifest(body)
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not prefix.startswith(f"s3://{bucket}/"):
        return []
    base = prefix.removeprefix(f"s3://{bucket}/")
    return [base + k for k in keys]


def _common(s: MonitorSettings, env: dict) -> dict:
    req: dict = {
        "RoleArn": s.role_arn,
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "Environment": env,
    }
    if s.subnets:
        req["NetworkConfig"] = {
            "VpcConfig": {"Subnets": list(s.subnets), "SecurityGroupIds": list(s.security_groups)}
        }
    return req


def _resources(s: MonitorSettings) -> dict:
    cluster = {"InstanceCount": 1, "InstanceType": s.instance_type, "VolumeSizeInGB": 30}
    # not on instance types with local storage, which SageMaker refuses a volume key for
    # (ProcessingClusterConfig.VolumeKmsKeyId in the API reference)
    if s.kms_key_arn and not has_local_storage(s.instance_type):
        cluster["VolumeKmsKeyId"] = s.kms_key_arn
    return {"ClusterConfig": cluster}


def processing_env(s: MonitorSettings, model: str, start: datetime, end: datetime) -> dict:
    """The environment Model Monitor gives a BYOC container, set by hand for a Processing job.

    The baseline folder carries the champion's tokenizer (`tokenizer/`), so no model archive is
    downloaded to count tokens.
    """
    return {
        "dataset_source": f"{LOCAL}/input/capture",
        "output_path": f"{LOCAL}/resultdata",
        "baseline_statistics": f"{LOCAL}/baseline/statistics.json",
        "baseline_constraints": f"{LOCAL}/baseline/constraints.json",
        "publish_cloudwatch_metrics": "Enabled",
        "endpoint_name": s.endpoint,
        "start_time": f"{start:%Y-%m-%dT%H:%M:%SZ}",
        "end_time": f"{end:%Y-%m-%dT%H:%M:%SZ}",
        "SLUICE_MODEL_DIR": f"{LOCAL}/baseline/tokenizer",
        "SLUICE_CHAMPION": model,
    }


def capture_manifest(bucket: str, keys: list[str]) -> list:
    return manifest(bucket, sorted(keys))[1]


def processing_request(
    s: MonitorSettings, name: str, model: str, manifest_key: str, start: datetime, end: datetime
) -> dict:
    """CreateProcessingJob: one window of capture against the champion's baseline."""

    def s3_input(input_name: str, uri: str, local: str, kind: str = "S3Prefix") -> dict:
        return {
            "InputName": input_name,
            "S3Input": {
                "S3Uri": uri,
                "LocalPath": local,
                "S3DataType": kind,
                "S3InputMode": "File",
                "S3DataDistributionType": "FullyReplicated",
            },
        }

    base = f"s3://{s.bucket}/{baseline_prefix(model)}"
    return {
        "ProcessingJobName": name,
        "ProcessingInputs": [
            s3_input(
                "capture",
                f"s3://{s.bucket}/{manifest_key}",
                f"{LOCAL}/input/capture",
                "ManifestFile",
            ),
            s3_input("baseline", base, f"{LOCAL}/baseline"),
        ],
        "ProcessingOutputConfig": {
            "Outputs": [
                {
                    "OutputName": "monitoring",
                    "S3Output": {
                        "S3Uri": f"s3://{s.bucket}/monitoring/{name}/output",
                        "LocalPath": f"{LOCAL}/resultdata",
                        "S3UploadMode": "EndOfJob",
                    },
                }
            ],
            **({"KmsKeyId": s.kms_key_arn} if s.kms_key_arn else {}),
        },
        "ProcessingResources": _resources(s),
        "AppSpecification": {"ImageUri": s.image, "ContainerEntrypoint": ENTRYPOINT},
        "Tags": [{"Key": "sluice:champion", "Value": model}],
        **_common(s, processing_env(s, model, start, end)),
    }


def schedule_name(stage: str) -> str:
    return f"sluice-{stage}-drift"


def schedule_request(s: MonitorSettings, model: str, expression: str) -> dict:
    """CreateMonitoringSchedule (UpdateMonitoringSchedule takes the same config) for ModelMonitor
    mode. Model Monitor sets dataset_source, output_path and the baseline paths itself and mounts
    only the endpoint's capture, so the container fetches the tokenizer from the baseline folder."""
    name = schedule_name(s.stage)
    base = f"s3://{s.bucket}/{baseline_prefix(model)}"
    env = {"SLUICE_TOKENIZER_S3_URI": base + "tokenizer/", "SLUICE_CHAMPION": model}
    job = {
        "BaselineConfig": {
            "ConstraintsResource": {"S3Uri": base + "constraints.json"},
            "StatisticsResource": {"S3Uri": base + "statistics.json"},
        },
        "MonitoringInputs": [
            {
                "EndpointInput": {
                    "EndpointName": s.endpoint,
                    "LocalPath": f"{LOCAL}/input/endpoint",
                    "S3InputMode": "File",
                    "S3DataDistributionType": "FullyReplicated",
                }
            }
        ],
        "MonitoringOutputConfig": {
            "MonitoringOutputs": [
                {
                    "S3Output": {
                        "S3Uri": f"s3://{s.bucket}/monitoring/schedule/{name}",
                        "LocalPath": f"{LOCAL}/resultdata",
                        "S3UploadMode": "EndOfJob",
                    }
                }
            ],
            **({"KmsKeyId": s.kms_key_arn} if s.kms_key_arn else {}),
        },
        "MonitoringResources": _resources(s),
        "MonitoringAppSpecification": {"ImageUri": s.image, "ContainerEntrypoint": ENTRYPOINT},
        **_common(s, env),
    }
    job["StoppingCondition"] = {"MaxRuntimeInSeconds": 3600}
    return {
        "MonitoringScheduleName": name,
        "MonitoringScheduleConfig": {
            "ScheduleConfig": {"ScheduleExpression": expression},
            "MonitoringJobDefinition": job,
            "MonitoringType": "DataQuality",
        },
    }


def cron_for(window_s: int) -> str:
    """Model Monitor takes hourly or daily cron expressions only."""
    return "cron(0 * ? * * *)" if window_s <= 3600 else "cron(0 0 ? * * *)"
