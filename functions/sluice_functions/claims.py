"""Per-object idempotency: each object version is claimed by exactly one transform job.

The content-derived job name makes an identical redelivered batch a no-op. Claims cover the rest:
S3 delivering one event twice into two different batches, or a crash after CreateTransformJob whose
messages come back grouped differently. A claim names the job; an upload whose claim names a job
that exists (and has not failed) is a duplicate and is dropped. A claim whose job failed is handed
back: the upload goes into a new job. A claim whose job does not exist is either in flight in
another invocation (young: retry later) or left by a crash (older than STALE_S: taken over).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from botocore.exceptions import ClientError

from .aws import client, error_code
from .batching import Upload, sequencer_order

STALE_S = 900  # longer than the function's timeout: a claim this old was left by a crash
TTL_S = 14 * 86400
# conditional writes in flight per invocation: a 1,000-upload batch makes ~2,000 of them, 10-20 s
# one after another at DynamoDB's single-digit milliseconds each (boto3 clients are thread-safe)
IN_FLIGHT = 16


def each(fn: Callable, items: Iterable) -> list:
    """fn(item) for every item, IN_FLIGHT at a time; results in the items' order."""
    items = list(items)
    if len(items) < 2:
        return [fn(i) for i in items]
    with ThreadPoolExecutor(min(IN_FLIGHT, len(items))) as pool:
        return list(pool.map(fn, items))


@dataclass
class Sorted:
    fresh: list[Upload]  # no claim: go into a new job
    duplicates: list[tuple[Upload, str]]  # claimed by a job that exists
    in_flight: list[Upload]  # claimed by a job being created elsewhere: retry later
    failed: list[tuple[Upload, str]] = field(default_factory=list)  # its job failed: run again


def _get(table: str, uploads: list[Upload]) -> dict[str, dict]:
    found: dict[str, dict] = {}
    ddb = client("dynamodb")
    keys = list(dict.fromkeys(u.identity for u in uploads))
    for start in range(0, len(keys), 100):
        request = {table: {"Keys": [{"object": {"S": k}} for k in keys[start : start + 100]]}}
        while request:
            resp = ddb.batch_get_item(RequestItems=request)
            for item in resp["Responses"].get(table, []):
                found[item["object"]["S"]] = {
                    "job": item["job"]["S"],
                    "claimed": int(item["claimed"]["N"]),
                }
            request = resp.get("UnprocessedKeys") or {}
    return found


def sort_uploads(table: str, uploads: list[Upload], job_status, now: float | None = None) -> Sorted:
    """Split uploads by what their claims say (see the module docstring); `job_status(name)` is
    the job's status, None if there is none."""
    now = time.time() if now is None else now
    claims = _get(table, uploads)
    out = Sorted([], [], [])
    status: dict[str, str | None] = {}
    for u in uploads:
        claim = claims.get(u.identity)
        if claim is None:
            out.fresh.append(u)
            continue
        job = claim["job"]
        if job not in status:
            status[job] = job_status(job)
        if status[job] == "Failed":
            out.failed.append((u, job))
        elif status[job] is not None:
            out.duplicates.append((u, job))
        elif now - claim["claimed"] > STALE_S:
            out.fresh.append(u)  # its claimant crashed before creating the job
        else:
            out.in_flight.append(u)
    return out


def claim(table: str, uploads: list[Upload], job: str, now: float | None = None) -> list[Upload]:
    """Claim each upload for `job`; returns the uploads another job claimed first."""
    now = int(time.time() if now is None else now)
    ddb = client("dynamodb")

    def lost(u: Upload) -> bool:
        try:
            ddb.put_item(
                TableName=table,
                Item={
                    "object": {"S": u.identity},
                    "job": {"S": job},
                    "claimed": {"N": str(now)},
                    "expires": {"N": str(now + TTL_S)},
                },
                # free, already ours, or stale (left by a crash)
                ConditionExpression="attribute_not_exists(#o) OR #j = :job OR #c < :stale",
                ExpressionAttributeNames={"#o": "object", "#j": "job", "#c": "claimed"},
                ExpressionAttributeValues={":job": {"S": job}, ":stale": {"N": str(now - STALE_S)}},
            )
        except ClientError as e:
            if error_code(e) != "ConditionalCheckFailedException":
                raise
            return True
        return False

    return [u for u, gone in zip(uploads, each(lost, uploads), strict=True) if gone]


def release(table: str, uploads: list[Upload], job: str) -> None:
    """Drop this job's claims (its creation failed): a retry may group the uploads differently."""
    ddb = client("dynamodb")

    def drop(u: Upload) -> None:
        try:
            ddb.delete_item(
                TableName=table,
                Key={"object": {"S": u.identity}},
                ConditionExpression="#j = :job",
                ExpressionAttributeNames={"#j": "job"},
                ExpressionAttributeValues={":job": {"S": job}},
            )
        except ClientError as e:
            if error_code(e) != "ConditionalCheckFailedException":
                raise

    each(drop, uploads)


def keep_latest(
    table: str, uploads: list[Upload], now: float | None = None
) -> list[tuple[Upload, str, str | None]]:
    """Record each upload's sequencer as the latest seen for its key, unless a later event of
    that key was already handled; returns the uploads superseded that way, each with the newer
    object version and the job that claimed it (S3 delivers events out of order: an older event
    must not start work over newer content)."""
    now = int(time.time() if now is None else now)
    ddb = client("dynamodb")

    def newer(u: Upload) -> tuple[Upload, str, str | None] | None:
        order = sequencer_order(u.sequencer)
        try:
            ddb.put_item(
                TableName=table,
                Item={
                    "object": {"S": f"latest#{u.location}"},
                    "sequencer": {"S": order},
                    "identity": {"S": u.identity},
                    "expires": {"N": str(now + TTL_S)},
                },
                # the same event again is fine (its claim decides); an older one is not
                ConditionExpression="attribute_not_exists(#o) OR #s <= :s",
                ExpressionAttributeNames={"#o": "object", "#s": "sequencer"},
                ExpressionAttributeValues={":s": {"S": order}},
            )
            return None
        except ClientError as e:
            if error_code(e) != "ConditionalCheckFailedException":
                raise
        latest = ddb.get_item(TableName=table, Key={"object": {"S": f"latest#{u.location}"}})
        identity = latest.get("Item", {}).get("identity", {}).get("S", "a later event")
        claim = ddb.get_item(TableName=table, Key={"object": {"S": identity}}).get("Item", {})
        return u, identity, claim.get("job", {}).get("S")

    # events without a sequencer (tests, replication) are ordered by nothing
    found = each(newer, [u for u in uploads if u.sequencer])
    return [x for x in found if x is not None]


def uploads_of(table: str, job: str) -> list[str]:
    """The S3 URIs of the uploads `job` claimed (the by-job index), oldest claim first: what a
    report names when the job's manifest cannot be read."""
    ddb = client("dynamodb")
    request = {
        "TableName": table,
        "IndexName": "by-job",
        "KeyConditionExpression": "#j = :job",
        "ExpressionAttributeNames": {"#j": "job"},
        "ExpressionAttributeValues": {":job": {"S": job}},
    }
    identities: list[str] = []
    while True:
        resp = ddb.query(**request)
        identities += [item["object"]["S"] for item in resp.get("Items", [])]
        if not resp.get("LastEvaluatedKey"):
            break
        request["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
    # "bucket/key@version": the key may hold "@", the version never does
    return sorted({f"s3://{i.rsplit('@', 1)[0]}" for i in identities})
