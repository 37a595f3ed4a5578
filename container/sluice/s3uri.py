"""S3 URIs (`s3://bucket/key`): the one parser the container's commands share."""

from __future__ import annotations

from .errors import SluiceError


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    """`s3://bucket/some/key` -> (`bucket`, `some/key`); anything else is a SluiceError."""
    if not is_s3(uri):
        raise SluiceError(f"{uri!r} is not an s3:// URI")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise SluiceError(f"{uri!r} names no bucket")
    return bucket, key
