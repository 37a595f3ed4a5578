"""A LoRA model that names its base model in S3 instead of carrying a copy of it.

A model that Batch Transform runs takes its weights from one model.tar.gz (`ModelDataUrl`): a
second data source needs `ModelDataSource`, which "currently you cannot use in conjunction with
SageMaker batch transform" (API reference, ContainerDefinition). So a retrained adapter either
ships inside a copy of its base (`lora_base=copy`), or its sluice.json names the base's artifact
(`lora_base=reference`: `{"base": {"s3_uri", "etag", "size"}}`) and the container fetches the
base with the model's execution role when it starts, refusing any object but the one the adapter
was trained on (its ETag). Every job that loads a model (serve, training's channels, monitor)
goes through `with_base`, so the rest of Sluice sees an ordinary `lora_merge=false` folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from .errors import SluiceError
from .s3uri import split_s3

log = logging.getLogger("sluice.base_ref")

BASE = "base"  # the sluice.json key
WEIGHTS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "*.bin.index.json")
# what a view takes from the base rather than from the adapter's folder: the base's own config
# (its dtype); never the base's own adapters, evaluation or edge export
FROM_BASE = {"config.json", "generation_config.json"}
NOT_FROM_BASE = {"sluice.json", "adapter", "adapters", "edge", "evaluation.json"}


def _s3():
    import boto3

    return boto3.client("s3")


def _error(uri: str, e: Exception) -> SluiceError:
    code = getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)
    return SluiceError(
        f"cannot read the base model {uri} ({code}): the job's role needs s3:GetObject and "
        "s3:ListBucket on it (and kms:Decrypt on its key)"
    )


def _listing(s3, uri: str) -> list[dict]:
    """The objects of an S3 URI: the one object, or every object under a prefix (`.../`)."""
    bucket, key = split_s3(uri)
    if key and not key.endswith("/"):
        head = s3.head_object(Bucket=bucket, Key=key)
        return [{"Key": key, "ETag": head["ETag"], "Size": head["ContentLength"]}]
    objects = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
        objects += [o for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    if not objects:
        raise SluiceError(f"the base model {uri} holds no objects")
    return objects


def describe(uri: str) -> dict:
    """What sluice.json records of a base: its URI, its ETag (one object's, or a digest of every
    object's key and ETag under a prefix) and its size in bytes."""
    return _described(uri)[0]


def _described(uri: str) -> tuple[dict, list[dict]]:
    """describe's answer and the objects it read (what a fetch then downloads)."""
    try:
        objects = _listing(_s3(), uri)
    except SluiceError:
        raise
    except Exception as e:  # botocore's ClientError and its connection errors alike
        raise _error(uri, e) from None
    if len(objects) == 1 and not uri.endswith("/"):
        etag = objects[0]["ETag"]
    else:
        lines = "".join(
            f"{o['Key']} {o['ETag']}\n" for o in sorted(objects, key=lambda o: o["Key"])
        )
        etag = "sha256:" + hashlib.sha256(lines.encode()).hexdigest()
    return {"s3_uri": uri, "etag": etag, "size": sum(o["Size"] for o in objects)}, objects


def has_weights(model_dir: Path) -> bool:
    return any(any(Path(model_dir).glob(pattern)) for pattern in WEIGHTS)


def strip_weights(model_dir: Path) -> int:
    """Remove the weight files from a published folder (its base is named instead). Bytes freed."""
    freed = 0
    for pattern in WEIGHTS:
        for f in Path(model_dir).glob(pattern):
            freed += f.stat().st_size
            f.unlink()
    return freed


def cache_root() -> Path:
    """Where fetched bases live: $SLUICE_BASE_CACHE, else the system's temporary folder."""
    return Path(os.environ.get("SLUICE_BASE_CACHE") or Path(tempfile.gettempdir()) / "sluice-base")


def fetch(ref: dict, cache: Path | None = None) -> Path:
    """The base model folder `ref` names, downloaded once per (URI, ETag) into the cache.

    Refused when the object in S3 is no longer the one trained on: an adapter applied to other
    weights would serve wrong answers without any error."""
    uri, cache = ref["s3_uri"], cache or cache_root()
    now, objects = _described(uri)
    if now["etag"] != ref.get("etag"):
        raise SluiceError(
            f"the base model {uri} changed since the adapter was trained (ETag {now['etag']}, "
            f"trained on {ref.get('etag')}): restore that version or train the adapter again"
        )
    final = cache / hashlib.sha256(f"{uri} {now['etag']}".encode()).hexdigest()[:20]
    marker = final / ".sluice-base.json"
    if marker.is_file():
        return final / json.loads(marker.read_text())["folder"]
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".fetching-", dir=cache))
    try:
        folder = _download(uri, objects, work)
        (work / marker.name).write_text(json.dumps({"folder": str(folder.relative_to(work))}))
        try:
            os.rename(work, final)  # atomic: another process of the job may have won the race
        except OSError:
            if not marker.is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("base model %s fetched (%.1f MB)", uri, now["size"] / 1e6)
    return final / json.loads(marker.read_text())["folder"]


def _download(uri: str, objects: list[dict], work: Path) -> Path:
    from .model import unpacked_model  # model.py loads models through this module

    s3, files = _s3(), work / "files"
    bucket, key = split_s3(uri)
    try:
        for o in objects:
            rel = Path(o["Key"]).name if o["Key"] == key else Path(o["Key"][len(key) :])
            dest = files / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, o["Key"], str(dest))
    except Exception as e:  # botocore's ClientError and its connection errors alike
        raise _error(uri, e) from None
    try:
        folder = unpacked_model(files, work)
    except SluiceError as e:
        raise SluiceError(f"the base model {uri}: {e}") from None
    for tar in files.glob("*.tar.gz"):  # unpacked: the archive's disk is the base's twice over
        tar.unlink()
    if not has_weights(folder):
        raise SluiceError(f"the base model {uri} holds no weights (it names a base itself?)")
    return folder


def reference(model_dir: Path) -> dict | None:
    """The base a published folder names, if any."""
    f = Path(model_dir) / "sluice.json"
    return json.loads(f.read_text()).get(BASE) if f.is_file() else None


def with_base(model_dir, cache: Path | None = None):
    """`model_dir` itself (as given: a Hub id stays a string), or, when it names its base instead
    of carrying it, a folder of links to both: the base's weights and config, the adapter's
    folder for everything else."""
    given, model_dir = model_dir, Path(model_dir)
    ref = reference(model_dir)
    if not ref or has_weights(model_dir):
        return given
    base = fetch(ref, cache)
    cache = cache or cache_root()
    view = Path(tempfile.mkdtemp(prefix="view-", dir=cache))  # links only; one per load
    for item in base.iterdir():
        mine = (model_dir / item.name).exists()
        if item.name not in NOT_FROM_BASE and (item.name in FROM_BASE or not mine):
            (view / item.name).symlink_to(item.resolve())
    for item in model_dir.iterdir():
        if not (view / item.name).exists():
            (view / item.name).symlink_to(item.resolve())
    log.info("model %s: its base %s from %s", model_dir, ref["s3_uri"], base)
    return view
