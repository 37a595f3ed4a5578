"""Account quotas, as SageMaker applies them when a job is created.

SageMaker counts, per instance type and per kind of job, the instances of the account's running
jobs; a Create that would pass the quota is refused with ResourceLimitExceeded and the message
SageMaker writes (the quota's name is its name in Service Quotas):

    The account-level service limit 'ml.g5.xlarge for transform job usage' is 2 Instances, with
    current utilization of 2 Instances and a request delta of 1 Instances. Please contact AWS
    support to request an increase for this limit.

Quotas are configured by that name (`sluice-local up --quota 'ml.g5.xlarge for transform job
usage=1'`). Unnamed ones default to DEFAULTS: transform jobs 2 instances of each type, as low as
new accounts often get for a GPU type; training and processing jobs unlimited (the retraining
state machine runs one training job at a time).

Capacity is not a quota: SageMaker creates the job, fails to find instances for it, and fails it
with CAPACITY_ERROR. `sluice-local up --no-capacity ml.g5.xlarge=2` makes the next 2 transform
jobs on that type fail so (what Sluice does then: docs/batch.md, waiting is not failing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .shapes import ApiError

# job kind -> (the quota's words, its instances (type, count) from a job's record)
USAGE: dict[str, tuple[str, Callable[[dict], tuple[str, int]]]] = {
    "TransformJob": (
        "transform job usage",
        lambda r: (
            r["TransformResources"]["InstanceType"],
            r["TransformResources"]["InstanceCount"],
        ),
    ),
    "TrainingJob": (
        "training job usage",
        lambda r: (
            r["ResourceConfig"].get("InstanceType", ""),
            r["ResourceConfig"].get("InstanceCount", 1),
        ),
    ),
    "ProcessingJob": (
        "processing job usage",
        lambda r: (
            r["ProcessingResources"]["ClusterConfig"]["InstanceType"],
            r["ProcessingResources"]["ClusterConfig"]["InstanceCount"],
        ),
    ),
}
DEFAULTS = {"TransformJob": 2, "TrainingJob": None, "ProcessingJob": None}  # None: no limit
RUNNING = ("InProgress", "Stopping")
# a job's FailureReason when SageMaker found no instances for it (as SageMaker words it)
CAPACITY_ERROR = (
    "CapacityError: Unable to provision requested ML compute capacity. Please retry using a "
    "different ML instance type."
)


def parse_capacity(specs: Iterable[str]) -> dict[str, int]:
    """`TYPE=N` strings -> {TYPE: N}: the next N transform jobs on TYPE find no capacity."""
    out: dict[str, int] = {}
    for spec in specs:
        name, sep, value = spec.rpartition("=")
        if not sep or not name.strip().startswith("ml.") or not value.strip().isdigit():
            raise ValueError(f"no capacity {spec!r}: expected '<instance type>=<jobs>'")
        out[name.strip()] = int(value)
    return out


def parse(specs: Iterable[str]) -> dict[str, int]:
    """`NAME=N` strings (NAME as Service Quotas names it) -> {NAME: N}."""
    out: dict[str, int] = {}
    for spec in specs:
        name, sep, value = spec.rpartition("=")
        words = name.strip()
        if (
            not sep
            or not value.strip().isdigit()
            or not any(words.endswith(f" for {w}") for w, _ in USAGE.values())
        ):
            raise ValueError(
                f"quota {spec!r}: expected '<instance type> for <transform|training|processing> "
                "job usage=<instances>', e.g. 'ml.g5.xlarge for transform job usage=1'"
            )
        out[words] = int(value)
    return out


def check(kind: str, request: dict, running: list[dict], quotas: dict[str, int]) -> None:
    """Raise SageMaker's ResourceLimitExceeded if creating this job passes its quota."""
    if kind not in USAGE:
        return
    words, instances = USAGE[kind]
    instance_type, delta = instances(request)
    name = f"{instance_type} for {words}"
    limit = quotas.get(name, DEFAULTS[kind])
    if limit is None:
        return
    used = sum(n for t, n in map(instances, running) if t == instance_type)
    if used + delta > limit:
        raise ApiError(
            "ResourceLimitExceeded",
            f"The account-level service limit '{name}' is {limit} Instances, with current "
            f"utilization of {used} Instances and a request delta of {delta} Instances. Please "
            "contact AWS support to request an increase for this limit.",
        )
