"""The local stack's crash consistency, piece by piece: snapshots with S3 bytes stored once,
the group commit that answers a change only once it is on disk, which requests count as
changes, the outbox, and SageMaker status changes published after a crash.
(tests/e2e/test_local_crash.py kills a whole stack at three points of the flow.)"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import pickle
import threading

import boto3
import pytest
from moto import mock_aws

from sluice_local import persist
from sluice_local.durability import Durability
from sluice_local.gateway import changes_only, changes_state, only_keys
from sluice_local.outbox import Outbox
from sluice_local.sagemaker.api import UNPUBLISHED, LocalSageMaker


def _s3():
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="bkt")
    return s3


def test_a_snapshot_stores_each_s3_content_once_and_restores_it(tmp_path):
    path = tmp_path / "moto"
    with mock_aws():
        s3 = _s3()
        s3.put_bucket_versioning(Bucket="bkt", VersioningConfiguration={"Status": "Enabled"})
        big = bytes(range(256)) * 4096  # 1 MiB
        v1 = s3.put_object(Bucket="bkt", Key="a", Body=big)["VersionId"]
        v_copy = s3.put_object(Bucket="bkt", Key="copy", Body=big)["VersionId"]
        s3.put_object(Bucket="bkt", Key="a", Body=b"second version")
        size = persist.snapshot(path)
        blobs = sorted(p.name for p in (path / "blobs").iterdir())
        assert len(blobs) == 2  # two distinct contents, three objects
        assert size < 100_000  # metadata only: the MiB is in blobs/
    with mock_aws():  # a fresh moto, as after a crash
        persist.restore(path)
        s3 = boto3.client("s3", region_name="us-east-1")
        # every version comes back (moto's own pickling keeps only each key's latest)
        assert s3.get_object(Bucket="bkt", Key="a", VersionId=v1)["Body"].read() == big
        assert s3.get_object(Bucket="bkt", Key="a")["Body"].read() == b"second version"
        s3.delete_object(Bucket="bkt", Key="copy", VersionId=v_copy)
        s3.delete_object(Bucket="bkt", Key="a", VersionId=v1)
        persist.snapshot(path)
        # the MiB is referenced by nothing now: deleted once the new snapshot is in place
        assert len(list((path / "blobs").iterdir())) == 1


def test_a_change_is_answered_only_once_a_snapshot_holds_it(tmp_path):
    path = tmp_path / "moto"
    with mock_aws():
        s3 = _s3()
        sqs = boto3.client("sqs", region_name="us-east-1")
        queue = sqs.create_queue(QueueName="uploads")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])
        s3.put_bucket_notification_configuration(
            Bucket="bkt",
            NotificationConfiguration={
                "QueueConfigurations": [
                    {"QueueArn": arn["Attributes"]["QueueArn"], "Events": ["s3:ObjectCreated:*"]}
                ]
            },
        )
        durable = Durability(path, print, every_s=3600)
        durable.start()
        durable.enable()
        before = durable.snapshots
        first = len(frames(path))

        answered_after = []

        def change(i: int) -> None:
            with durable.applying(persist.KEYS):  # a plain PutObject, as the gateway says
                s3.put_object(Bucket="bkt", Key=f"k{i}", Body=str(i).encode())
            on_disk = durable.snapshots
            durable.commit()
            answered_after.append(durable.snapshots > on_disk)  # a later snapshot holds it

        threads = [threading.Thread(target=change, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert answered_after == [True] * 16
        commits = durable.snapshots - before
        # only what an upload changes was written: its key and the message it sent, no service
        written = frames(path)[first:]
        assert set().union(*(f["services"] for f in written)) == set()
        assert any(f[persist.KEYS] for f in written) and any(f[persist.MESSAGES] for f in written)
        durable.close()
    assert 1 <= commits < 16  # group commit: one snapshot answers many changes
    with mock_aws():
        persist.restore(path)
        keys = boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket="bkt")["Contents"]
        assert len(keys) == 16
        sqs = boto3.client("sqs", region_name="us-east-1")
        attrs = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
        assert attrs["ApproximateNumberOfMessages"] == "17"  # the notifications, and the test one


def test_a_change_whose_snapshot_failed_is_not_acknowledged(tmp_path, monkeypatch):
    """A full disk: the request that waited for that snapshot gets an error (its client
    retries), the operator a line; the next snapshot holds both changes."""
    path = tmp_path / "moto"
    said = []
    with mock_aws():
        s3 = _s3()
        durable = Durability(path, lambda *a: said.append(a), every_s=3600)
        durable.start()
        durable.enable()
        put = persist.Store.put

        def full_disk(self, snap):
            monkeypatch.setattr(persist.Store, "put", put)  # once
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(persist.Store, "put", full_disk)
        with durable.applying("s3"):
            s3.put_object(Bucket="bkt", Key="first", Body=b"1")
        with pytest.raises(RuntimeError, match=r"could not write its state: .*No space"):
            durable.commit()
        assert said == [("state", "snapshot failed: [Errno 28] No space left on device")]
        with durable.applying("s3"):
            s3.put_object(Bucket="bkt", Key="second", Body=b"2")
        durable.commit()
        durable.close()
    with mock_aws():
        persist.restore(path)
        listed = boto3.client("s3", region_name="us-east-1").list_objects_v2(Bucket="bkt")
        assert [o["Key"] for o in listed["Contents"]] == ["first", "second"]


def frames(path) -> list[dict]:
    """The frames of the current log, as restoring reads them."""
    manifest = json.loads((path / "manifest.json").read_text())
    return [pickle.loads(f) for f in persist._frames(path / manifest["log"])]


def cut_short(path) -> None:
    """What kill -9 in the middle of an append leaves: half a frame after the last whole one."""
    manifest = json.loads((path / "manifest.json").read_text())
    log = path / manifest["log"]
    end = sum(persist.FRAME.size + len(f) for f in persist._frames(log))
    with open(log, "r+b") as f:
        f.seek(end)
        f.write(persist.FRAME.pack(1000, 0) + b"\x80\x05 half a frame")


def environ(
    method: str, *, target: str = "", body: bytes = b"", query: str = "", service="", path=""
):
    env = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "CONTENT_TYPE": "application/x-www-form-urlencoded" if body.startswith(b"Action") else "",
        "wsgi.input": io.BytesIO(body),
    }
    if target:
        env["HTTP_X_AMZ_TARGET"] = target
    if service:
        scope = f"x/20261203/us-east-1/{service}/aws4_request"
        env["HTTP_AUTHORIZATION"] = f"AWS4-HMAC-SHA256 Credential={scope}, SignedHeaders=host"
    return env


def test_which_requests_change_state():
    assert changes_state(environ("PUT", service="s3"), b"")
    assert changes_state(environ("DELETE", service="s3"), b"")
    assert not changes_state(environ("GET", service="s3"), b"")
    assert changes_state(environ("POST", target="AmazonSQS.SendMessage"), b"")
    assert changes_state(environ("POST", target="AmazonSQS.DeleteMessageBatch"), b"")
    assert not changes_state(environ("POST", target="AmazonSQS.ReceiveMessage"), b"")
    assert changes_state(environ("POST", target="DynamoDB_20120810.PutItem"), b"")
    assert not changes_state(environ("POST", target="DynamoDB_20120810.BatchGetItem"), b"")
    publish = b"Action=Publish&TopicArn=t&Message=m"
    assert changes_state(environ("POST", body=publish, service="sns"), publish)
    describe = b"Action=DescribeAlarms"
    assert not changes_state(environ("POST", body=describe, service="monitoring"), describe)
    # a plain upload changes only its bucket's keys; tags, copies, subresources, deletes: S3
    put = environ("PUT", service="s3", path="/bkt/k", query="x-id=PutObject")
    assert only_keys(put)
    assert not only_keys({**put, "HTTP_X_AMZ_TAGGING": "team=ml"})
    assert not only_keys({**put, "HTTP_X_AMZ_COPY_SOURCE": "bkt/j"})
    assert not only_keys(environ("PUT", service="s3", path="/bkt/k", query="tagging"))
    assert not only_keys(environ("PUT", service="s3", path="/bkt/k", query="partNumber=1"))
    assert not only_keys(environ("PUT", service="s3", path="/bkt"))  # CreateBucket
    assert not only_keys(environ("DELETE", service="s3", path="/bkt/k"))
    # a send or a visibility change: only messages; a delete also records its receipt handle
    assert changes_only(put) == persist.KEYS
    assert changes_only(environ("POST", target="AmazonSQS.SendMessageBatch")) == persist.MESSAGES
    visibility = environ("POST", target="AmazonSQS.ChangeMessageVisibility")
    assert changes_only(visibility) == persist.MESSAGES
    assert changes_only(environ("POST", target="AmazonSQS.DeleteMessageBatch")) is None


def test_a_plain_upload_writes_only_its_key_and_tags_still_survive(tmp_path):
    path = tmp_path / "moto"
    with mock_aws():
        s3 = _s3()
        store = persist.Store(path)
        store.write()
        s3.put_object(Bucket="bkt", Key="plain", Body=b"x")
        store.write(persist.changed_by(persist.KEYS))  # what the gateway says of a plain PUT
        s3.put_object(Bucket="bkt", Key="tagged", Body=b"y", Tagging="team=ml")
        store.write(persist.changed_by("s3"))  # and of one with x-amz-tagging
        plain, tagged = frames(path)[-2:]
        assert plain["services"] == {} and plain[persist.KEYS]  # no bucket pickled
        assert "s3" in tagged["services"]
    with mock_aws():
        persist.restore(path)
        s3 = boto3.client("s3", region_name="us-east-1")
        assert s3.get_object(Bucket="bkt", Key="plain")["Body"].read() == b"x"
        tags = s3.get_object_tagging(Bucket="bkt", Key="tagged")["TagSet"]
        assert tags == [{"Key": "team", "Value": "ml"}]


def test_the_outbox_keeps_work_until_it_is_done(tmp_path):
    box = Outbox(tmp_path)
    first = box.add({"kind": "event", "n": 1})
    second = box.add({"kind": "invoke", "n": 2})
    assert [item["n"] for _, item in Outbox(tmp_path).pending()] == [1, 2]  # after a crash
    box.done(first)
    assert [oid for oid, _ in Outbox(tmp_path).pending()] == [second]
    # a run's own items are not a previous run's leftovers: its threads work on them already
    # (a restart once failed reading one that a thread had finished meanwhile)
    restarted = Outbox(tmp_path)
    restarted.add({"kind": "event", "n": 3})
    assert [item["n"] for _, item in restarted.pending()] == [2]


def test_a_status_change_saved_but_not_published_is_published_at_the_next_start(tmp_path):
    def crash(*_):
        raise SystemExit("kill -9 between saving the record and putting its event")

    api = LocalSageMaker(tmp_path, crash)
    api.resources["TransformJob"]["j"] = {
        "TransformJobName": "j",
        "TransformJobArn": "arn:aws:sagemaker:us-east-1:123456789012:transform-job/j",
        "TransformJobStatus": "InProgress",
    }
    with contextlib.suppress(SystemExit):
        api.update("TransformJob", "j", TransformJobStatus="Completed")
    events = []
    again = LocalSageMaker(tmp_path, lambda kind, detail: events.append((kind, detail)))
    assert again.resources["TransformJob"]["j"][UNPUBLISHED]
    assert again.publish_pending() == ["TransformJob j"]
    ((kind, detail),) = events
    assert kind == "SageMaker Transform Job State Change"
    assert detail["TransformJobStatus"] == "Completed" and UNPUBLISHED not in detail
    assert UNPUBLISHED not in LocalSageMaker(tmp_path, print).resources["TransformJob"]["j"]


def test_a_state_written_before_the_per_service_layout_still_loads(tmp_path):
    """Stacks before this layout wrote one moto.pickle, S3 bytes inline."""
    from moto.s3.models import s3_backends

    with mock_aws():
        _s3().put_object(Bucket="bkt", Key="k", Body=b"old layout")
        state = {"moto.s3.models.s3_backends": {a: dict(r) for a, r in s3_backends.items()}}
        buf = io.BytesIO()
        persist._Pickler(buf, None).dump(state)
        (tmp_path / "moto.pickle").write_bytes(buf.getvalue())
    with mock_aws():
        persist.restore(tmp_path / "moto")
        s3 = boto3.client("s3", region_name="us-east-1")
        assert s3.get_object(Bucket="bkt", Key="k")["Body"].read() == b"old layout"


def test_s3_metadata_is_pickled_once_and_again_after_a_request_that_changes_it(tmp_path):
    """Objects' metadata is reused from the last snapshot (its cost would grow with every
    object) until a request with a subresource (?acl, ?tagging, ...) may have changed it."""
    path = tmp_path / "moto"
    with mock_aws():
        s3 = _s3()
        s3.put_object(Bucket="bkt", Key="k", Body=b"x")
        persist.snapshot(path)
        s3.put_object_acl(Bucket="bkt", Key="k", ACL="public-read")
        persist.objects_changed()  # what the gateway does for ?acl
        persist.snapshot(path)
    with mock_aws():
        persist.restore(path)
        grants = boto3.client("s3", region_name="us-east-1").get_object_acl(Bucket="bkt", Key="k")
        assert any(g["Permission"] == "READ" for g in grants["Grants"])


def test_s3_keys_go_to_the_log_as_changes_whose_cost_follows_them(tmp_path, monkeypatch):
    """A snapshot of S3 writes the buckets without their keys and adds only the key names
    changed since the last one: its size does not grow with the objects the buckets hold.
    Overwrites, deletes and versions come back; a frame a crash cut short is never read; a log
    grown to four times its first frame is started anew with everything."""
    path = tmp_path / "moto"
    with mock_aws():
        s3 = _s3()
        store = persist.Store(path)
        written = []
        for n in (10, 1000):
            for i in range(n):
                s3.put_object(Bucket="bkt", Key=f"many/{n}/{i}", Body=b"x")
            store.write(persist.changed_by("s3"))  # the first one starts a log with everything
            s3.put_object(Bucket="bkt", Key=f"one-more-{n}", Body=b"y")
            written.append(store.write(persist.changed_by("s3")))
        assert abs(written[1] - written[0]) < 200, written  # one object more, at 10 or 1010
        s3.put_object(Bucket="bkt", Key="one-more-10", Body=b"overwritten")
        s3.delete_object(Bucket="bkt", Key="many/10/0")
        s3.put_bucket_versioning(Bucket="bkt", VersioningConfiguration={"Status": "Enabled"})
        v1 = s3.put_object(Bucket="bkt", Key="v", Body=b"1")["VersionId"]
        s3.put_object(Bucket="bkt", Key="v", Body=b"2")
        store.write(persist.changed_by("s3"))
        s3.put_object(Bucket="bkt", Key="never-acknowledged", Body=b"z")
        cut_short(path)  # kill -9 in the middle of an append
    with mock_aws():
        persist.restore(path)
        s3 = boto3.client("s3", region_name="us-east-1")
        keys = {
            o["Key"]
            for p in s3.get_paginator("list_objects_v2").paginate(Bucket="bkt")
            for o in p.get("Contents", [])
        }
        assert len(keys) == 10 + 1000 + 2 + 1 - 1 and "many/10/0" not in keys
        assert s3.get_object(Bucket="bkt", Key="one-more-10")["Body"].read() == b"overwritten"
        assert s3.get_object(Bucket="bkt", Key="v", VersionId=v1)["Body"].read() == b"1"
        assert s3.get_object(Bucket="bkt", Key="v")["Body"].read() == b"2"
        monkeypatch.setattr(persist, "COMPACT_AT", 0)  # a new log at 4x its first frame
        store, logs = persist.Store(path), []
        for i in range(6):
            for k in range(500):
                s3.put_object(Bucket="bkt", Key=f"many/1000/{k}", Body=str(i).encode())
            store.write(persist.changed_by("s3"))
            logs.append(store.manifest["log"])
        assert len(set(logs)) == 2, logs  # the first snapshot of a process, then once grown
        assert {p.name for p in path.glob("*.journal")} == {logs[-1]}  # the old ones are gone
    with mock_aws():
        persist.restore(path)
        s3 = boto3.client("s3", region_name="us-east-1")
        assert s3.get_object(Bucket="bkt", Key="many/1000/7")["Body"].read() == b"5"


def test_a_failed_append_starts_a_new_log(tmp_path, monkeypatch):
    """A log that could not grow (a full disk) is left: the next snapshot starts a new one."""
    path = tmp_path / "moto"
    with mock_aws():
        s3 = _s3()
        monkeypatch.setattr(persist.Log, "GROW", 4096)
        store = persist.Store(path)
        store.write()
        room = store.log.capacity - store.log.length
        for i in range(room // 1000 + 1):  # records of 1,000-character names: past the room
            s3.put_object(Bucket="bkt", Key=f"a/{i:04d}".ljust(1000, "a"), Body=b"a")

        def full_disk(fd, offset, length):
            raise OSError(errno.ENOSPC, "No space left on device")

        with monkeypatch.context() as m:
            m.setattr(persist.os, "posix_fallocate", full_disk)
            with pytest.raises(OSError, match="No space"):
                store.write({"s3"})
        first = store.manifest["log"]
        s3.put_object(Bucket="bkt", Key="b", Body=b"b")
        store.write({"s3"})
        assert store.manifest["log"] != first
    with mock_aws():
        persist.restore(path)
        s3 = boto3.client("s3", region_name="us-east-1")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="bkt", MaxKeys=1000)["Contents"]]
        assert len(keys) == room // 1000 + 2 and keys[-1] == "b"


def test_the_log_works_where_blocks_cannot_be_allocated(tmp_path, monkeypatch):
    """macOS has no posix_fallocate, some file systems refuse it: the file is extended."""
    monkeypatch.delattr(persist.os, "posix_fallocate")
    path = tmp_path / "moto"
    with mock_aws():
        _s3().put_object(Bucket="bkt", Key="k", Body=b"v")
        persist.snapshot(path)
    with mock_aws():
        persist.restore(path)
        s3 = boto3.client("s3", region_name="us-east-1")
        assert s3.get_object(Bucket="bkt", Key="k")["Body"].read() == b"v"


def test_a_state_in_the_per_service_layout_still_loads(tmp_path):
    """Stacks before the log wrote a file per snapshot and journals of a recorded length."""
    path = tmp_path / "moto"
    with mock_aws():
        s3 = _s3()
        s3.put_object(Bucket="bkt", Key="k", Body=b"per-service layout")
        store = persist.Store(path)
        snap = store.pickle(persist.SERVICES)
        store.blobs.flush()
        (path / "snapshot-1.pickle").write_bytes(pickle.dumps(snap["services"]))
        keys = snap[persist.KEYS]["data"]
        (path / "keys-1.journal").write_bytes(keys + b"\x80\x05 half a record")
        manifest = {
            "generation": 1,
            "files": dict.fromkeys(snap["services"], "snapshot-1.pickle"),
            "journal": {"file": "keys-1.journal", "length": len(keys), "records": 1},
        }
        (path / "manifest.json").write_text(json.dumps(manifest))
    with mock_aws():
        persist.restore(path)
        s3 = boto3.client("s3", region_name="us-east-1")
        assert s3.get_object(Bucket="bkt", Key="k")["Body"].read() == b"per-service layout"
        persist.snapshot(path)  # now in a log; the old files are gone
        assert sorted(p.name for p in path.glob("*.*")) == ["log-2.journal", "manifest.json"]


def test_sqs_messages_are_pickled_again_only_when_a_receive_changed_them(tmp_path):
    path = tmp_path / "moto"
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="q")["QueueUrl"]
        for i in range(3):
            sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")
        store = persist.Store(path)
        store.write({"sqs"})
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1)["Messages"][0]
        store.write({"sqs"})  # the received one again (its receive count); the others reused
    with mock_aws():
        persist.restore(path)  # what was in flight is visible again
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.get_queue_url(QueueName="q")["QueueUrl"]
        msgs = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["All"]
        )["Messages"]
        counts = {m["Body"]: m["Attributes"]["ApproximateReceiveCount"] for m in msgs}
        assert counts == {"m0": "1", "m1": "1", "m2": "1", got["Body"]: "2"}


def test_a_send_and_a_visibility_change_write_only_messages(tmp_path):
    path = tmp_path / "moto"
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="q")["QueueUrl"]
        store = persist.Store(path)
        store.write()
        sqs.send_message(QueueUrl=url, MessageBody="a")
        got = sqs.receive_message(QueueUrl=url)["Messages"][0]
        sqs.change_message_visibility(
            QueueUrl=url, ReceiptHandle=got["ReceiptHandle"], VisibilityTimeout=600
        )
        store.write(persist.changed_by(persist.MESSAGES))  # what the gateway says of both
        last = frames(path)[-1]
        assert last["services"] == {} and last[persist.MESSAGES]
    with mock_aws():
        persist.restore(path)  # in flight before: visible again, its receive counted
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.get_queue_url(QueueName="q")["QueueUrl"]
        [msg] = sqs.receive_message(QueueUrl=url, MessageSystemAttributeNames=["All"])["Messages"]
        assert msg["Body"] == "a" and msg["Attributes"]["ApproximateReceiveCount"] == "2"


def test_sqs_messages_go_to_a_journal_whose_cost_follows_the_changes(tmp_path, monkeypatch):
    """A snapshot of SQS writes the queues without their messages and adds only the messages
    sent, received or deleted since the last one: its size does not grow with the queue's
    depth (a burst waiting for its window or for quota). Order, receive counts and deletes come
    back; a record a crash cut short is never read."""
    from moto.sqs.models import sqs_backends

    from sluice_local import moto_fixes

    for owner, name, value in moto_fixes.backend_patches():  # the stack's SQS in O(messages)
        monkeypatch.setattr(owner, name, value, raising=False)
    path = tmp_path / "moto"
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="q")["QueueUrl"]
        store = persist.Store(path)
        written, sent = [], []
        for n in (10, 2000):
            for start in range(0, n, 10):
                entries = [{"Id": str(i), "MessageBody": f"{n}-{start + i}"} for i in range(10)]
                sqs.send_message_batch(QueueUrl=url, Entries=entries)
                sent += [e["MessageBody"] for e in entries]
            store.write({"sqs"})  # the first one starts a log with everything
            sqs.send_message(QueueUrl=url, MessageBody=f"one-more-{n}")
            sent.append(f"one-more-{n}")
            written.append(store.write({"sqs"}))
        assert abs(written[1] - written[0]) < 300, written  # one message more, at 11 or 2011
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2)["Messages"]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=got[1]["ReceiptHandle"])
        store.write({"sqs"})
        cut_short(path)  # kill -9 in the middle of an append
    with mock_aws():
        persist.restore(path)
        [queue] = sqs_backends["123456789012"]["us-east-1"].queues.values()
        bodies = [m.body for m in queue._messages]
        assert bodies == [b for b in sent if b != got[1]["Body"]]  # the queue's order
        counts = {m.body: m.approximate_receive_count for m in queue._messages}
        assert counts[got[0]["Body"]] == 1 and counts[sent[-1]] == 0
        assert all(m.visible for m in queue._messages)  # in flight before: visible again
