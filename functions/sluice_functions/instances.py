"""What AWS documents about ML instance types that the shape of a request depends on.

One table for every place that builds a SageMaker request (the functions here, the local stack's
rule set, the template's `InstanceStorage` mapping, which a test keeps equal to it).
"""

from __future__ import annotations

# Instance families with local NVMe instance storage. SageMaker API Reference, the
# `VolumeKmsKeyId` of TransformResources, ProcessingClusterConfig and ResourceConfig and the
# `KmsKeyId` of CreateEndpointConfig: "Certain Nitro-based instances include local storage ...
# Local storage volumes are encrypted using a hardware module on the instance. You can't request
# a VolumeKmsKeyId when using an instance type with local storage." The families are those the
# Amazon EC2 User Guide ("Instance store volume limits for EC2 instances") lists with instance
# store volumes, among the ML instance types SageMaker offers. Where in doubt a family is listed:
# leaving out a key SageMaker would take costs nothing (the volume is still encrypted), sending one
# it refuses fails the job.
LOCAL_STORAGE_FAMILIES = frozenset(
    {
        "c5d",
        "m5d",
        "r5d",
        "c6id",
        "m6id",
        "r6id",
        "c6gd",
        "m6gd",
        "r6gd",
        "r7gd",
        "dl1",
        "g4dn",
        "g5",
        "g6",
        "g6e",
        "gr6",
        "p3dn",
        "p4d",
        "p4de",
        "p5",
        "p5e",
        "p5en",
        "p6-b200",
        "p6-b300",
        "p6e-gb200",
        "g7",
        "g7e",
        "trn1",
        "trn1n",
        "trn2",
    }
)

# NVIDIA GPU families among SageMaker's ML instance types: the ones whose hosts run the NVIDIA
# driver that TransformAmiVersion / InferenceAmiVersion choose.
GPU_FAMILIES = frozenset(
    {
        "g4dn",
        "g5",
        "g6",
        "g6e",
        "gr6",
        "p2",
        "p3",
        "p3dn",
        "p4d",
        "p4de",
        "p5",
        "p5e",
        "p5en",
        "p6-b200",
        "p6-b300",
        "p6e-gb200",
        "g7",
        "g7e",
    }
)


def family(instance_type: str) -> str:
    """`ml.g5.xlarge` -> `g5` (also for a type given without the `ml.` prefix)."""
    parts = instance_type.split(".")
    return parts[1] if parts[0] == "ml" and len(parts) > 2 else parts[0]


def has_local_storage(instance_type: str) -> bool:
    """Whether SageMaker refuses a volume KMS key for this instance type."""
    return family(instance_type) in LOCAL_STORAGE_FAMILIES


def is_gpu(instance_type: str) -> bool:
    return family(instance_type) in GPU_FAMILIES
