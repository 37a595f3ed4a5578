"""The local SageMaker's control plane: the operations Sluice uses, answered as SageMaker does.

Resources (jobs, models, endpoint configs, endpoints, model package groups and packages) are kept
in one JSON file under the state folder. Every request is validated against botocore's model and
every answer rendered through it (shapes.py); names, ARNs, errors and status fields follow
SageMaker's. Jobs and endpoints really run (jobs.py, endpoints.py); each status change is
published as SageMaker's EventBridge event.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import ACCOUNT, REGION, aws_rules
from ..validation import message
from . import quotas
from .quotas import RUNNING
from .shapes import ApiError, member_shape, operation, output, render, validate


@dataclass(frozen=True)
class Kind:
    """A resource type: CreateX, DescribeX, ListXs, DeleteX (and StopX for jobs)."""

    name: str  # "TrainingJob"
    event: str | None  # the EventBridge detail-type of its status changes, if SageMaker has one

    @property
    def words(self) -> list[str]:
        return re.findall(r"[A-Z][a-z]*", self.name)

    @property
    def arn_part(self) -> str:  # "training-job"
        return "-".join(w.lower() for w in self.words)

    @property
    def label(self) -> str:  # "training job", for messages
        return " ".join(w.lower() for w in self.words)

    @property
    def status(self) -> str | None:  # "TrainingJobStatus"
        return None if self.name in ("Model", "EndpointConfig") else f"{self.name}Status"


KINDS = {
    k.name: k
    for k in [
        Kind("TrainingJob", "SageMaker Training Job State Change"),
        Kind("HyperParameterTuningJob", "SageMaker HyperParameter Tuning Job State Change"),
        Kind("TransformJob", "SageMaker Transform Job State Change"),
        Kind("ProcessingJob", "SageMaker Processing Job State Change"),
        Kind("CompilationJob", None),
        Kind("Model", None),
        Kind("EndpointConfig", None),
        Kind("Endpoint", "SageMaker Endpoint State Change"),
        Kind("ModelPackageGroup", None),
        Kind("ModelPackage", "SageMaker Model Package State Change"),
    ]
}
JOBS = ("TrainingJob", "HyperParameterTuningJob", "TransformJob", "ProcessingJob", "CompilationJob")
FIRST_STATUS = {"CompilationJob": "INPROGRESS", "Endpoint": "Creating"}
UNPUBLISHED = "_StatusUnpublished"  # a record's own flag, never rendered (not in any shape)


def arn(kind: Kind, name: str) -> str:
    return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:{kind.arn_part}/{name.lower()}"


class LocalSageMaker:
    """Answers SageMaker API calls; `runners[kind]` run what a Create starts."""

    def __init__(
        self,
        state_dir: Path,
        emit: Callable[[str, dict], None],
        quotas: dict[str, int] | None = None,
        no_capacity: dict[str, int] | None = None,
    ):
        self.dir = state_dir
        self.quotas = dict(quotas or {})  # Service Quotas name -> instances (quotas.py)
        self.no_capacity = dict(no_capacity or {})  # instance type -> jobs to fail (quotas.py)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.file = self.dir / "state.json"
        self.emit = emit  # (detail-type, detail) -> the event bus
        self.lock = threading.RLock()
        self.runners: dict[str, object] = {}
        doc = json.loads(self.file.read_text()) if self.file.exists() else {}
        self.resources: dict[str, dict[str, dict]] = {k: {} for k in KINDS}
        self.resources.update(doc.get("resources", {}))
        self.tags: dict[str, list[dict]] = doc.get("tags", {})
        self.ops = self.operations()

    def finds_no_capacity(self, instance_type: str) -> bool:
        """True for the next jobs on `instance_type` that `no_capacity` says fail for capacity."""
        with self.lock:
            left = self.no_capacity.get(instance_type, 0)
            if left:
                self.no_capacity[instance_type] = left - 1
            return left > 0

    # --- persistence and records ----------------------------------------------------------------

    def save(self) -> None:
        with self.lock:
            tmp = self.file.with_suffix(".tmp")
            tmp.write_text(json.dumps({"resources": self.resources, "tags": self.tags}, indent=1))
            tmp.replace(self.file)

    def get(self, kind: str, name: str) -> dict:
        record = self.find(kind, name)
        if record is None:
            k = KINDS[kind]
            raise ApiError(
                "ValidationException", f'Could not find {k.label} "{arn(k, _key(kind, name))}".'
            )
        return record

    def find(self, kind: str, name: str) -> dict | None:
        key = _key(kind, name)
        with self.lock:
            found = self.resources[kind].get(key)
            if found is None:  # ARNs carry names in lower case
                found = next(
                    (r for k, r in self.resources[kind].items() if k.lower() == key.lower()), None
                )
            return found

    def update(self, kind: str, name: str, **changes) -> dict:
        """Change a record; a status change is published as SageMaker's event. The record says
        so until the event is on the bus (whose outbox keeps it): a crash in between publishes
        it at the next start (`publish_pending`) rather than losing it."""
        k = KINDS[kind]
        with self.lock:
            record = self.resources[kind][_key(kind, name)]
            before = record.get(k.status) if k.status else None
            record.update(changes)
            record["LastModifiedTime"] = time.time()
            publish = bool(k.status and k.event and record.get(k.status) != before)
            if publish:
                record[UNPUBLISHED] = True
            self.save()
            snapshot = json.loads(json.dumps(record))
        if publish:
            self._publish(kind, _key(kind, name), snapshot)
        return snapshot

    def _publish(self, kind: str, key: str, record: dict) -> None:
        self.emit(KINDS[kind].event, self.event_detail(kind, record))
        with self.lock:
            live = self.resources[kind].get(key)
            if live is not None and live.get(KINDS[kind].status) == record.get(KINDS[kind].status):
                live.pop(UNPUBLISHED, None)
                self.save()

    def publish_pending(self) -> list[str]:
        """Status changes saved but not yet on the bus when the stack stopped: published now."""
        with self.lock:
            pending = [
                (kind, key, json.loads(json.dumps(r)))
                for kind in self.resources
                for key, r in self.resources[kind].items()
                if r.get(UNPUBLISHED)
            ]
        for kind, key, record in pending:
            self._publish(kind, key, record)
        return [f"{kind} {key}" for kind, key, _ in pending]

    def event_detail(self, kind: str, record: dict) -> dict:
        """The detail of SageMaker's state-change event: the description, times in epoch ms."""
        shape = operation(f"Describe{kind}").output_shape
        detail = render(record, shape) or {}
        for key, member in shape.members.items():
            if member.type_name == "timestamp" and key in detail:
                detail[key] = int(detail[key] * 1000)
        detail["Tags"] = {t["Key"]: t["Value"] for t in self.tags.get(record[f"{kind}Arn"], [])}
        return detail

    # --- dispatch -------------------------------------------------------------------------------

    def handles(self, op: str) -> bool:
        return op in self.ops

    def operations(self) -> dict[str, Callable[[dict], dict]]:
        ops: dict[str, Callable[[dict], dict]] = {}
        for kind in KINDS:
            ops[f"Create{kind}"] = lambda p, kind=kind: self.create(kind, p)
            ops[f"Describe{kind}"] = lambda p, kind=kind: self.describe(kind, p)
            ops[f"List{kind}s"] = lambda p, kind=kind: self.list(kind, p)
            ops[f"Delete{kind}"] = lambda p, kind=kind: self.delete(kind, p)
        for kind in JOBS:
            ops[f"Stop{kind}"] = lambda p, kind=kind: self.stop(kind, p)
        ops.update(
            ListTrainingJobsForHyperParameterTuningJob=self.list_trials,
            UpdateEndpoint=self.update_endpoint,
            UpdateModelPackage=self.update_package,
            AddTags=self.add_tags,
            ListTags=self.list_tags,
            DeleteTags=self.delete_tags,
        )
        return ops

    def call(self, op: str, params: dict) -> dict:
        """One API call: validated request in, rendered answer out (ApiError on refusal)."""
        params = validate(op, params)
        # the rules AWS documents in prose, those that depend on what exists (an endpoint's
        # fleet, its scaling) answered from this SageMaker's resources
        found = aws_rules.problems("sagemaker", op, params, world=self)
        if found:
            raise ApiError("ValidationException", message(found))
        result = self.ops[op](params)
        return output(op, result)

    # --- what aws_rules may ask (aws_rules.World) ------------------------------------------------

    def config_variants(self, config: str) -> list[dict] | None:
        record = self.find("EndpointConfig", config)
        return None if record is None else list(record.get("ProductionVariants") or [])

    def endpoint_variants(self, endpoint: str) -> list[dict] | None:
        record = self.find("Endpoint", endpoint)
        if record is None:
            return None
        types = {
            v["VariantName"]: v.get("InstanceType")
            for v in self.config_variants(record["EndpointConfigName"]) or []
        }
        return [
            {**v, "InstanceType": types.get(v.get("VariantName"))}
            for v in record.get("ProductionVariants") or []
        ]

    def scaled_variants(self, endpoint: str) -> set[str] | None:
        """Variants registered with Application Auto Scaling (moto's backend, this process)."""
        return aws_rules.moto_scaled_variants(endpoint)

    def model_containers(self, model: str) -> list[dict] | None:
        record = self.find("Model", model)
        if record is None:
            return None
        return [c for c in [record.get("PrimaryContainer"), *(record.get("Containers") or [])] if c]

    # (the Lambda-side questions of aws_rules.World are never asked about SageMaker requests)

    # --- generic operations ---------------------------------------------------------------------

    def create(self, kind: str, p: dict) -> dict:
        k = KINDS[kind]
        p = _jsonable(p)
        if kind == "ModelPackage":
            return self._create_package(p)
        name = p[f"{kind}Name"]
        record = {key: v for key, v in p.items() if key != "Tags"}
        now = time.time()
        record.update({f"{kind}Arn": arn(k, name), "CreationTime": now, "LastModifiedTime": now})
        if k.status:
            record[k.status] = FIRST_STATUS.get(kind, "InProgress" if kind in JOBS else "Completed")
        if kind == "HyperParameterTuningJob":
            from .tuning import initial_fields

            record.update(initial_fields(record))
        with self.lock:
            if _key(kind, name) in self.resources[kind]:
                code = "ResourceInUse" if kind in JOBS else "ValidationException"
                raise ApiError(
                    code,
                    f'Cannot create {k.label} "{arn(k, name)}": it already '
                    "exists (names must be unique).",
                )
            self._check_references(kind, record)
            running = [r for r in self.resources[kind].values() if r.get(k.status) in RUNNING]
            quotas.check(kind, record, running, self.quotas)
            self.resources[kind][_key(kind, name)] = record
            self.tags[record[f"{kind}Arn"]] = p.get("Tags", [])
            self.save()
        runner = self.runners.get(kind)
        if runner is not None:
            runner.start(name)
        return {f"{kind}Arn": record[f"{kind}Arn"]}

    def _check_references(self, kind: str, record: dict) -> None:
        if kind == "HyperParameterTuningJob":
            from .tuning import check_request

            check_request(record)
        elif kind == "TransformJob":
            self.get("Model", record["ModelName"])
        elif kind == "EndpointConfig":
            for v in record["ProductionVariants"]:
                self.get("Model", v["ModelName"])
        elif kind == "Endpoint":
            self.get("EndpointConfig", record["EndpointConfigName"])

    def describe(self, kind: str, p: dict) -> dict:
        name = p.get(f"{kind}Name") or p.get("ModelPackageName")
        return self.get(kind, name)

    def list(self, kind: str, p: dict) -> dict:
        op = f"List{kind}s"
        list_key = next(
            m for m, s in operation(op).output_shape.members.items() if s.type_name == "list"
        )
        summary = member_shape(op, list_key, "[]")
        with self.lock:
            records = [json.loads(json.dumps(r)) for r in self.resources[kind].values()]
        k = KINDS[kind]
        if p.get("NameContains"):
            records = [r for r in records if p["NameContains"] in r.get(f"{kind}Name", "")]
        if p.get("StatusEquals") and k.status:
            records = [r for r in records if r.get(k.status) == p["StatusEquals"]]
        if kind == "ModelPackage" and p.get("ModelPackageGroupName"):
            records = [
                r for r in records if r["ModelPackageGroupName"] == p["ModelPackageGroupName"]
            ]
        if p.get("ModelApprovalStatus"):
            records = [
                r for r in records if r.get("ModelApprovalStatus") == p["ModelApprovalStatus"]
            ]
        for field_, test in (
            ("CreationTimeAfter", lambda r, t: r["CreationTime"] > t),
            ("CreationTimeBefore", lambda r, t: r["CreationTime"] < t),
        ):
            if p.get(field_) is not None:
                records = [r for r in records if test(r, p[field_].timestamp())]
        by = {"Name": f"{kind}Name", "Status": k.status}.get(p.get("SortBy"), "CreationTime")
        records.sort(
            key=lambda r: (r.get(by) is None, r.get(by)),
            reverse=p.get("SortOrder", "Descending") == "Descending",
        )
        start = int(p.get("NextToken") or 0)
        size = int(p.get("MaxResults") or 100)
        page = records[start : start + size]
        out = {list_key: [render(r, summary) for r in page]}
        if start + size < len(records):
            out["NextToken"] = str(start + size)
        return out

    def delete(self, kind: str, p: dict) -> dict:
        name = p.get(f"{kind}Name") or p.get("ModelPackageName")
        record = self.get(kind, name)
        runner = self.runners.get(kind)
        if kind == "Endpoint" and runner is not None:
            runner.delete(record["EndpointName"])
        with self.lock:
            self.resources[kind].pop(_key(kind, name), None)
            self.tags.pop(record.get(f"{kind}Arn", ""), None)
            self.save()
        return {}

    def stop(self, kind: str, p: dict) -> dict:
        name = p[f"{kind}Name"]
        record = self.get(kind, name)
        status = record[KINDS[kind].status]
        if status not in ("InProgress", "INPROGRESS", "STARTING"):
            raise ApiError(
                "ValidationException",
                f"The {KINDS[kind].label} {name} is {status}: nothing to stop.",
            )
        self.runners[kind].stop(name)
        return {}

    # --- specific operations --------------------------------------------------------------------

    def list_trials(self, p: dict) -> dict:
        """ListTrainingJobsForHyperParameterTuningJob: the tuning job's trials as summaries."""
        from .tuning import list_trials

        return list_trials(
            self.get("HyperParameterTuningJob", p["HyperParameterTuningJobName"]), self, p
        )

    def update_endpoint(self, p: dict) -> dict:
        name = p["EndpointName"]
        record = self.get("Endpoint", name)
        if record["EndpointStatus"] != "InService":
            raise ApiError(
                "ValidationException",
                f'Cannot update in-progress endpoint "{record["EndpointArn"]}".',
            )
        self.get("EndpointConfig", p["EndpointConfigName"])
        self.runners["Endpoint"].update(name, _jsonable(p))
        return {"EndpointArn": record["EndpointArn"]}

    def _create_package(self, p: dict) -> dict:
        group = p.get("ModelPackageGroupName")
        if not group:
            raise ApiError(
                "ValidationException",
                "only versioned model packages (with ModelPackageGroupName) are supported locally",
            )
        self.get("ModelPackageGroup", group)
        k = KINDS["ModelPackage"]
        with self.lock:
            token = p.get("ClientToken")
            for existing in self.resources["ModelPackage"].values():
                if token and existing.get("ClientToken") == token:
                    # the token "guarantees that the call to this API is idempotent"
                    return {"ModelPackageArn": existing["ModelPackageArn"]}
            version = 1 + sum(
                r["ModelPackageGroupName"] == group for r in self.resources["ModelPackage"].values()
            )
            key = f"{group}/{version}"
            now = time.time()
            record = {key_: v for key_, v in p.items() if key_ != "Tags"}
            record.update(
                {
                    "ModelPackageName": group,
                    "ModelPackageGroupName": group,
                    "ModelPackageVersion": version,
                    "ModelPackageArn": arn(k, key),
                    "ModelPackageStatus": "Completed",
                    "CreationTime": now,
                    "LastModifiedTime": now,
                    "ModelApprovalStatus": p.get("ModelApprovalStatus", "PendingManualApproval"),
                    "ModelPackageStatusDetails": {
                        "ValidationStatuses": [],
                        "ImageScanStatuses": [],
                    },
                }
            )
            self.resources["ModelPackage"][key] = record
            self.tags[record["ModelPackageArn"]] = p.get("Tags", [])
            self.save()
        self.emit(k.event, self.event_detail("ModelPackage", record))
        return {"ModelPackageArn": record["ModelPackageArn"]}

    def update_package(self, p: dict) -> dict:
        p = _jsonable(p)
        key = _key("ModelPackage", p["ModelPackageArn"])
        record = self.get("ModelPackage", key)
        changes = {k: p[k] for k in ("ModelApprovalStatus", "ApprovalDescription") if k in p}
        metadata = dict(record.get("CustomerMetadataProperties") or {})
        metadata.update(p.get("CustomerMetadataProperties") or {})
        for gone in p.get("CustomerMetadataPropertiesToRemove") or []:
            metadata.pop(gone, None)
        changes["CustomerMetadataProperties"] = metadata
        before = record.get("ModelApprovalStatus")
        snapshot = self.update("ModelPackage", key, **changes)
        if snapshot.get("ModelApprovalStatus") != before:  # published as a package state change
            self.emit(KINDS["ModelPackage"].event, self.event_detail("ModelPackage", snapshot))
        return {"ModelPackageArn": record["ModelPackageArn"]}

    def add_tags(self, p: dict) -> dict:
        with self.lock:
            tags = {t["Key"]: t for t in self.tags.get(p["ResourceArn"], [])}
            tags.update({t["Key"]: t for t in p["Tags"]})
            self.tags[p["ResourceArn"]] = list(tags.values())
            self.save()
        return {"Tags": p["Tags"]}

    def list_tags(self, p: dict) -> dict:
        return {"Tags": self.tags.get(p["ResourceArn"], [])}

    def delete_tags(self, p: dict) -> dict:
        with self.lock:
            self.tags[p["ResourceArn"]] = [
                t for t in self.tags.get(p["ResourceArn"], []) if t["Key"] not in p["TagKeys"]
            ]
            self.save()
        return {}


def _key(kind: str, name: str) -> str:
    """Records are keyed by name; a model package by `<group>/<version>` (also from its ARN)."""
    if kind == "ModelPackage" and name.startswith("arn:"):
        return name.split(":model-package/", 1)[1]
    if name.startswith("arn:"):
        return name.rsplit("/", 1)[1]
    return name


def _jsonable(p: dict) -> dict:
    """A validated request as stored: datetimes back to epoch seconds."""
    return json.loads(json.dumps(p, default=lambda o: o.timestamp()))
