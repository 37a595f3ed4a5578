"""moto's state on disk: what the local stack acknowledged survives a crash (`kill -9`).

moto keeps each service's state in backend objects; they are pickled (as LocalStack persists
the same backends), with what cannot be pickled (locks, threads, running interpreters) replaced by
fresh equivalents. S3 objects' bytes are stored once each, by content hash, under `blobs/`; their
metadata goes to an append-only journal (KeyJournal): a snapshot of S3 writes the buckets without
their keys, and appends only the key names changed since the last one, so its cost follows the
changes, not the number of objects the buckets hold.

SQS messages go to a journal of their own (MessageJournal): a snapshot of SQS writes the queues
without their messages and appends only the messages added, changed (a receive) or deleted since
the last one, so a queue thousands deep costs a snapshot what changed in it, not its depth.

A snapshot pickles only the services changed since the last one, into one file; a manifest names
the file that holds each service's latest state, and replacing it (rename) makes a snapshot
current, so what is on disk is always one point in time. durability.py decides when snapshots are
taken: before a change is answered.
Executions that were running when the stack stopped cannot resume mid-flight: on restore they
are marked ABORTED with the reason, which the retrain guard and the execution events then see.
Messages that were in flight go back on their queues at once: the consumers that held them died
with the stack (on AWS they would reappear after their visibility timeout).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import importlib
import io
import itertools
import json
import mmap
import os
import pickle
import struct
import threading
import weakref
import zlib
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

# every backend the local stack uses: (service as requests are signed for it, module, attribute)
BACKENDS = [
    ("s3", "moto.s3.models", "s3_backends"),
    ("sqs", "moto.sqs.models", "sqs_backends"),
    ("sns", "moto.sns.models", "sns_backends"),
    ("dynamodb", "moto.dynamodb.models", "dynamodb_backends"),
    ("ssm", "moto.ssm.models", "ssm_backends"),
    ("events", "moto.events.models", "events_backends"),
    ("states", "moto.stepfunctions.parser.models", "stepfunctions_parser_backends"),
    ("monitoring", "moto.cloudwatch.models", "cloudwatch_backends"),
    ("logs", "moto.logs.models", "logs_backends"),
    ("kms", "moto.kms.models", "kms_backends"),
    ("iam", "moto.iam.models", "iam_backends"),
    ("scheduler", "moto.scheduler.models", "scheduler_backends"),
    (
        "application-autoscaling",
        "moto.applicationautoscaling.models",
        "applicationautoscaling_backends",
    ),
]
SERVICES = frozenset(name for name, _, _ in BACKENDS)
# a snapshot's entries for the journals' records, and what a change that touches only those is
# marked as (a plain upload: its keys; a notification: the queue's messages)
KEYS = "s3 keys"
MESSAGES = "sqs messages"
# what a request to one service also changes in others (moto notifies in-process); an S3
# request's notifications are announced as they are sent (`announce_notifications`)
ALSO_CHANGES = {"sns": {"sqs"}}
# what each of moto's S3 notification senders changes (EventBridge: whatever its rules target);
# a message sent to a queue changes only its messages (SQSBackend.send_message -> add_message)
NOTIFIES = {
    "_send_sqs_message": frozenset({MESSAGES}),
    "_send_sns_message": frozenset({"sns", "sqs"}),
    "_send_event_bridge_message": frozenset({"events", "sqs", "sns", "logs", "states"}),
}
LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))


def _nested_defaultdict(items: dict) -> defaultdict:
    """SSM's `defaultdict(lambda: defaultdict(dict))`, rebuilt."""
    out: defaultdict = defaultdict(lambda: defaultdict(dict))
    for k, v in items.items():
        out[k].update(v)
    return out


def _none():
    return None


def _private_key(pem: bytes):
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    return load_pem_private_key(pem, password=None)


def _subclassed_defaultdict(cls, factory, attrs: dict, items: dict):
    """A defaultdict subclass whose __init__ takes other arguments (SSM's ParameterDict)."""
    obj = cls.__new__(cls)
    defaultdict.__init__(obj, factory)
    obj.__dict__.update(attrs)
    obj.update(items)
    return obj


class _BlobRef(str):
    """The content hash of an S3 object's bytes, pickled as a reference to blobs/<hash>."""


_loading: list[Blobs] = []  # the blobs of the pickles being loaded (_Unpickler.load)


def _blob(digest: str) -> bytes:
    """A reference to blobs/<hash>, read (a reduction, not a persistent id: the pickler would
    call persistent_id for every object it writes, ~1,500 Python calls a snapshot)."""
    return _loading[-1].read(digest)


def _fake_key(cls, state: dict, value: bytes, digest: str):
    """An S3 object (moto's FakeKey) rebuilt from its metadata and its bytes."""
    obj = cls.__new__(cls)
    obj.__setstate__({**state, "value": value})
    obj.__dict__["_sluice_blob"] = digest
    return obj


def _fake_key_pickled(metadata: bytes, value: bytes):
    cls, state, digest = pickle.loads(metadata)
    obj = _fake_key(cls, state, value, digest)
    obj.__dict__["_sluice_pickled"] = (_epoch[0], metadata, digest)
    return obj


def _message_pickled(cls, state: bytes):
    """An SQS message rebuilt from its pickled attributes (_Pickler._message)."""
    obj = cls.__new__(cls)
    obj.__dict__.update(pickle.loads(state))
    return obj


def _message_bytes(message) -> tuple[tuple, bytes]:
    """An SQS message's attributes pickled, again only when a receive or a visibility change
    changed them (the stamp): a snapshot of a queue thousands deep mostly copies bytes."""
    m = vars(message)
    stamp = (
        m.get("sent_timestamp"),
        m.get("approximate_receive_count"),
        m.get("receipt_handle"),
        m.get("visible_at"),
        m.get("delayed_until"),
        len(m) - ("_sluice_pickled" in m),
    )
    cached = m.get("_sluice_pickled")
    if cached is None or cached[0] != stamp:
        buf = io.BytesIO()
        _Pickler(buf, None).dump({k: v for k, v in m.items() if k != "_sluice_pickled"})
        cached = (stamp, buf.getvalue())
        m["_sluice_pickled"] = cached
    return cached


# S3 objects' metadata pickled at epoch N is reused while the epoch is N (see _Pickler._key)
_epoch = [0]


def objects_changed() -> None:
    """A request may have changed existing S3 objects' metadata (tags, ACL, retention, ...)."""
    _epoch[0] += 1


def _versioned_store(cls, lists: dict):
    """A bucket's keys with every version (moto's _VersionedKeyStore), rebuilt."""
    store = cls()
    for key, versions in lists.items():
        dict.__setitem__(store, key, versions)
    return store


class Blobs:
    """S3 objects' bytes, one file per distinct content (moto's objects never change in place).
    A snapshot names the new contents while requests are held off (`put`) and writes them after
    (`flush`), before the log frame that refers to them."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.referenced: set[str] = set()
        self.unwritten: dict[str, bytes] = {}  # digest -> bytes, until flush() writes them
        for tmp in self.folder.glob("*.tmp"):  # cut short by a crash
            tmp.unlink(missing_ok=True)
        self.stored = {p.name for p in self.folder.iterdir()}

    def put(self, key) -> str:
        digest = key.__dict__.get("_sluice_blob")
        if digest is None:
            try:
                value = key.value
            except ValueError:  # a deleted key's buffer is closed (moto pickles it as empty)
                value = b""
            digest = hashlib.sha256(value).hexdigest()
            if digest not in self.stored:
                self.unwritten[digest] = value
            key.__dict__["_sluice_blob"] = digest
        self.referenced.add(digest)
        return digest

    def flush(self) -> None:
        """Write the contents named since the last flush (what fails stays for the next)."""
        while self.unwritten:
            digest, value = next(iter(self.unwritten.items()))
            path = self.folder / digest
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(value)
            tmp.replace(path)  # a blob under its name is whole: a crash leaves only *.tmp
            self.stored.add(digest)
            del self.unwritten[digest]

    def read(self, digest: str) -> bytes:
        return (self.folder / digest).read_bytes()

    def keep_only(self, digests: set[str]) -> int:
        """Delete the blobs no snapshot refers to any more; returns how many."""
        gone = self.stored - digests
        for digest in gone:
            (self.folder / digest).unlink(missing_ok=True)
        self.stored -= gone
        return len(gone)


# Buckets' key stores being restored, by (account, bucket): filled from the journal
_restoring: dict[tuple[str, str], object] = {}


def _journaled_store(cls, bucket: tuple[str, str]):
    """A bucket's keys, restored from the key journal after the S3 pickle is loaded."""
    store = cls()
    _restoring[bucket] = store
    return store


# key names changed since each journal last looked: moto changes a bucket's keys only through
# these methods of its _VersionedKeyStore (put, copy, multipart completion, delete, versions)
_journals: weakref.WeakSet = weakref.WeakSet()


def _track(method):
    @functools.wraps(method)
    def changed(self, key, *args, **kwargs):
        try:
            return method(self, key, *args, **kwargs)
        finally:
            for journal in list(_journals):
                journal.dirty.add((id(self), key))

    return changed


def track_key_changes() -> None:
    from moto.s3.utils import _VersionedKeyStore as Store

    if not getattr(Store, "_sluice_tracked", False):
        for name in ("__setitem__", "__delitem__", "setlist", "pop"):
            setattr(Store, name, _track(getattr(Store, name)))
        Store._sluice_tracked = True


def _records(chunks):
    """The records pickled one after another in each chunk, in order."""
    for chunk in chunks:
        data = io.BytesIO(chunk)
        while data.tell() < len(chunk):
            yield pickle.load(data)


class KeyJournal:
    """S3 objects' metadata as (bucket, key name, the name's versions pickled, or None once it
    is gone) records in the log. Each snapshot adds the names changed since the last (tracked
    as moto changes them); a new log starts with every live name (`collect(rewrite=True)`),
    as does the snapshot after a request that may change objects in place (tags, ACL:
    `objects_changed`)."""

    def __init__(self, blobs: Blobs):
        self.blobs = blobs
        self.dirty: set[tuple[int, str]] = set()  # (id of a bucket's key store, key name)
        self.pending: set[tuple[int, str]] = set()  # taken by a snapshot not on disk yet
        self.live: dict[tuple[tuple[str, str], str], frozenset[str]] = {}  # -> its blobs
        self.epoch: int | None = None  # None: rewrite at the next snapshot
        self.stores: dict[int, tuple[tuple[str, str], object]] = {}
        _journals.add(self)
        track_key_changes()

    def collect(self, rewrite: bool) -> dict:
        """This snapshot's records (taken while no request applies): the names changed since the
        last one, or every live name when `rewrite`."""
        self.stores = {
            id(bucket.keys): ((bucket.account_id, bucket.name), bucket.keys)
            for regions in _backends("s3").values()
            for backend in regions.values()
            for bucket in list(backend.buckets.values())
        }
        taken, self.dirty = self.dirty, set()
        self.pending |= taken
        if rewrite:
            names = [(b, st, n) for b, st in self.stores.values() for n in list(dict.keys(st))]
        else:  # a store not found: its bucket was deleted (the S3 pickle no longer has it)
            names = [(*self.stores[sid], n) for sid, n in self.pending if sid in self.stores]
        out, live = io.BytesIO(), {}
        for bucket, store, name in names:
            versions = dict.get(store, name)
            payload = None
            if versions is not None:
                buf = io.BytesIO()
                self.blobs.referenced = set()
                _Pickler(buf, self.blobs).dump(list(versions))
                payload = buf.getvalue()
            live[(bucket, name)] = None if payload is None else frozenset(self.blobs.referenced)
            pickle.dump((bucket, name, payload), out, protocol=pickle.HIGHEST_PROTOCOL)
        return {"rewrite": rewrite, "data": out.getvalue(), "live": live, "epoch": _epoch[0]}

    def written(self, batch: dict) -> None:
        """The batch is on disk."""
        if batch["rewrite"]:
            self.live = {}
        for key, refs in batch["live"].items():
            if refs is None:
                self.live.pop(key, None)
            else:
                self.live[key] = refs
        self.epoch, self.pending = batch["epoch"], set()

    def referenced(self) -> set[str]:
        return set().union(*self.live.values())

    def replay(self, records) -> None:
        """Fill the key stores the S3 pickle left empty (`_journaled_store`) with each name's
        last record (earlier ones may name blobs deleted since)."""
        last: dict[tuple[tuple[str, str], str], bytes | None] = {}
        for bucket, name, payload in records:
            last[(bucket, name)] = payload
        for (bucket, name), payload in last.items():
            store = _restoring.get(bucket)
            if store is not None and payload is not None:  # else: deleted since
                versions = _Unpickler(io.BytesIO(payload), self.blobs).load()
                dict.__setitem__(store, name, versions)
        _restoring.clear()


# Queues being restored, by (account, region, name): filled from the message journal
_restoring_queues: dict[tuple[str, str, str], object] = {}


def _journaled_queue(cls, state: dict, queue: tuple[str, str, str]):
    """An SQS queue without its messages (the message journal holds them), rebuilt."""
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    obj._messages, obj._pending_messages = [], set()
    _restoring_queues[queue] = obj
    return obj


# each MessageJournal's messages changed since it last looked, by the journal's number
_touched: dict[int, dict] = {}
_journal_numbers = itertools.count()


def _message_setattr(self, name: str, value) -> None:
    """moto's Message.__setattr__ here: a receive or a visibility change sets attributes."""
    object.__setattr__(self, name, value)
    for touched in list(_touched.values()):  # a journal may be collected meanwhile
        touched[self] = None


def track_message_changes() -> None:
    from moto.sqs.models import Message

    Message.__setattr__ = _message_setattr


class MessageJournal:
    """SQS messages as (queue, message id, the message pickled, or None once deleted) records
    in the log. Each snapshot of SQS adds only what changed since the last one: the messages
    added to and gone from each queue (the queue's messages as a set, against those written
    last: one pass in C), and those whose attributes a receive or a visibility change set
    (tracked as moto sets them); new ones in queue order, so a restored queue keeps its order.
    A new log starts with every message (`collect(rewrite=True)`). (Its cost follows the
    changes: comparing every message's stamp cost ~0.8 us a queued message a snapshot.)"""

    def __init__(self):
        self.sets: dict[tuple, set] = {}  # queue -> the messages written (held: ids stay unique)
        self.queues: dict[int, tuple[tuple[str, str, str], object]] = {}
        self.number = next(_journal_numbers)
        self.touched: dict = {}  # messages changed since collect() last looked
        self.pending: dict = {}  # taken by a snapshot not on disk yet
        _touched[self.number] = self.touched
        weakref.finalize(self, _touched.pop, self.number, None)
        track_message_changes()

    def collect(self, rewrite: bool) -> dict:
        """This snapshot's records (taken while no request applies)."""
        self.queues = {
            id(q): ((account, region, q.name), q)
            for account, regions in _backends("sqs").items()
            for region, backend in regions.items()
            for q in list(backend.queues.values())
        }
        self.pending.update(self.touched)
        self.touched.clear()
        out, sets = io.BytesIO(), {}
        for queue, q in self.queues.values():
            now = set(q._messages)
            before = set() if rewrite else self.sets.get(queue, set())
            new = now - before
            added = []
            for m in reversed(q._messages):  # the new ones are at the end
                if len(added) == len(new):
                    break
                if m in new:
                    added.append(m)
            changed = [m for m in self.pending if m in now and m not in new]
            for m in [*reversed(added), *changed]:
                pickle.dump((queue, m.id, _message_bytes(m)[1]), out, pickle.HIGHEST_PROTOCOL)
            for m in before - now:
                pickle.dump((queue, m.id, None), out, protocol=pickle.HIGHEST_PROTOCOL)
            sets[queue] = now
        return {"data": out.getvalue(), "sets": sets}

    def written(self, batch: dict) -> None:
        self.sets, self.pending = batch["sets"], {}  # only once on disk: else diffed again

    def replay(self, records) -> None:
        """Fill the queues the SQS pickle left empty (`_journaled_queue`)."""
        from moto.sqs.models import Message

        by_queue: dict[tuple, dict[str, bytes]] = {}
        for queue, message_id, data in records:
            messages = by_queue.setdefault(queue, {})
            if data is None:
                messages.pop(message_id, None)
            else:
                messages[message_id] = data  # a changed message keeps its place
        for queue, q in _restoring_queues.items():
            q._messages = [_message_pickled(Message, d) for d in by_queue.get(queue, {}).values()]
        _restoring_queues.clear()


@functools.cache
def _moto_types() -> dict[str, type]:
    from moto.s3.models import FakeKey
    from moto.s3.utils import _VersionedKeyStore
    from moto.sqs.models import Message, Queue
    from moto.utilities.tagging_service import TaggingService

    return {
        "key": FakeKey,
        "versions": _VersionedKeyStore,
        "message": Message,
        "queue": Queue,
        "tagging": TaggingService,
    }


# types _Pickler.reducer_override leaves to pickle's own rules: answered without its checks (a
# snapshot meets ~100 objects, each once a chain of isinstance calls)
_plain_types: set[type] = set()


@functools.cache
def _special_types() -> tuple[type, ...]:
    """What _Pickler._reduce may reduce, by type (the cryptography keys by module)."""
    return (
        _BlobRef,
        *_moto_types().values(),
        *LOCK_TYPES,
        defaultdict,
        threading.Event,
        threading.Condition,
        threading.Thread,
    )


class _Pickler(pickle.Pickler):
    def __init__(self, file, blobs: Blobs | None, journaled: dict | None = None):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.blobs = blobs
        # id of a key store -> (its bucket, the store); id of a queue -> (its key, the queue)
        self.journaled = journaled or {}
        self.references = 0  # blob references written
        types = _moto_types()
        self.queue_type = types["queue"]
        self.key_type = types["key"]
        self.versions_type = types["versions"]
        self.tagging_type = types["tagging"]
        self.message_type = types["message"]

    def _key(self, obj):
        """An S3 object: its bytes as a blob reference, its metadata pickled once and reused
        while no request could have changed it (`objects_changed`), so a snapshot's cost does
        not grow with every object the buckets hold."""
        cached = obj.__dict__.get("_sluice_pickled")
        if cached is None or cached[0] != _epoch[0]:
            digest = self.blobs.put(obj)
            skip = ("_value_buffer", "lock", "_sluice_blob", "_sluice_pickled")
            state = {k: v for k, v in vars(obj).items() if k not in skip}
            inner = io.BytesIO()
            nested = _Pickler(inner, self.blobs)
            nested.dump((type(obj), state, digest))
            if nested.references:  # e.g. a multipart upload's parts: not reusable on its own
                return _fake_key, (type(obj), state, _BlobRef(digest), digest)
            cached = (_epoch[0], inner.getvalue(), digest)
            obj.__dict__["_sluice_pickled"] = cached
        self.blobs.referenced.add(cached[2])
        return _fake_key_pickled, (cached[1], _BlobRef(cached[2]))

    def _message(self, message):
        """An SQS message outside a journaled queue (a DLQ's redrive source, a test's)."""
        return _message_pickled, (type(message), _message_bytes(message)[1])

    def reducer_override(self, obj):
        cls = type(obj)
        if cls in _plain_types:
            return NotImplemented
        out = self._reduce(obj)
        if out is NotImplemented and not (
            issubclass(cls, _special_types()) or cls.__module__.startswith("cryptography")
        ):
            _plain_types.add(cls)
        return out

    def _reduce(self, obj):
        if type(obj) is _BlobRef:
            self.references += 1
            return _blob, (str(obj),)
        if isinstance(obj, self.message_type):
            return self._message(obj)
        if isinstance(obj, self.queue_type) and id(obj) in self.journaled:
            skip = ("_messages", "_pending_messages")  # in-flight FIFO groups: released anyway
            state = {k: v for k, v in vars(obj).items() if k not in skip}
            return _journaled_queue, (type(obj), state, self.journaled[id(obj)][0])
        if isinstance(obj, self.tagging_type) and obj.tags:
            # moto keeps an empty tag set per S3 object, read exactly as no entry: dropped, or
            # the S3 pickle would grow with the objects again
            for arn in [a for a, tags in obj.tags.items() if not tags]:
                del obj.tags[arn]
            return NotImplemented
        if isinstance(obj, self.versions_type) and id(obj) in self.journaled:
            return _journaled_store, (type(obj), self.journaled[id(obj)][0])
        if isinstance(obj, self.versions_type):  # its items() hold only each key's latest
            return _versioned_store, (type(obj), {k: list(v) for k, v in dict.items(obj)})
        if (
            self.blobs is not None
            and isinstance(obj, self.key_type)
            and "_value_buffer" in vars(obj)
        ):
            return self._key(obj)
        if isinstance(obj, LOCK_TYPES):
            return (threading.RLock if isinstance(obj, LOCK_TYPES[1]) else threading.Lock), ()
        if isinstance(obj, threading.Event | threading.Condition):
            return type(obj), ()
        if isinstance(obj, threading.Thread):
            return _none, ()
        if type(obj).__module__.startswith("cryptography") and hasattr(obj, "private_bytes"):
            from cryptography.hazmat.primitives import serialization as ser

            pem = obj.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
            return _private_key, (pem,)  # KMS keys' material
        if isinstance(obj, defaultdict):
            if getattr(obj.default_factory, "__name__", "") == "<lambda>":
                return _nested_defaultdict, (dict(obj),)
            if type(obj) is not defaultdict:
                return _subclassed_defaultdict, (
                    type(obj),
                    obj.default_factory,
                    vars(obj),
                    dict(obj),
                )
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, blobs: Blobs):
        super().__init__(file)
        self.blobs = blobs

    def load(self):
        _loading.append(self.blobs)
        try:
            return super().load()
        finally:
            _loading.pop()

    def persistent_load(self, pid):
        """A blob reference as states before `_blob` wrote it."""
        kind, digest = pid
        if kind != "blob":
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")
        return self.blobs.read(digest)


@functools.cache
def _backends(name: str):
    _, module, attr = next(b for b in BACKENDS if b[0] == name)
    return getattr(importlib.import_module(module), attr)


_listeners: list[weakref.WeakMethod] = []


def _announcing(send, names: frozenset[str]):
    @functools.wraps(send)
    def announced(*args, **kwargs):
        for listener in list(_listeners):
            method = listener()
            if method is not None:
                method(names)
        return send(*args, **kwargs)

    announced._sluice_announced = True
    return announced


def announce_notifications(listener) -> None:
    """Call the bound method `listener(services)` whenever an S3 request notifies other
    services, before it does (inside the request): an upload then costs its snapshot S3 and the
    queue it notified, not every service S3 could notify (SNS keeps every message it published,
    so its pickle grows)."""
    import moto.s3.notifications as notifications

    for name, names in NOTIFIES.items():
        send = getattr(notifications, name)
        if not getattr(send, "_sluice_announced", False):
            setattr(notifications, name, _announcing(send, names))
    _listeners[:] = [ref for ref in _listeners if ref() is not None]
    _listeners.append(weakref.WeakMethod(listener))


def changed_by(service: str) -> frozenset[str]:
    """The backends a request signed for `service` may change (all, if it is unknown); KEYS or
    MESSAGES: only S3 keys or SQS messages (a journal's records, not the buckets or queues)."""
    if service in (KEYS, MESSAGES):
        return frozenset({service})
    if service not in SERVICES:
        return SERVICES
    return frozenset({service, *ALSO_CHANGES.get(service, ())})


FRAME = struct.Struct(">QI")  # a log frame's header: the payload's length and CRC-32
COMPACT_AT = 64 << 20  # a log is started anew once it holds this many bytes and 4x its first


def _crc(data) -> int:
    """CRC-32 in pieces small enough that zlib keeps the interpreter (past 5 KiB it lets go)."""
    crc, view = 0, memoryview(data)
    for at in range(0, len(view), 4096):
        crc = zlib.crc32(view[at : at + 4096], crc)
    return crc


def _frames(path: Path):
    """The payloads of a log's whole frames, in order, up to the first that a crash cut short
    (or the zeros past the last): what follows was never acknowledged."""
    data = memoryview(path.read_bytes())
    at = 0
    while at + FRAME.size <= len(data):
        length, crc = FRAME.unpack_from(data, at)
        payload = data[at + FRAME.size : at + FRAME.size + length]
        if not length or len(payload) < length or _crc(payload) != crc:
            return
        yield payload
        at += FRAME.size + length


def _allocate(fd: int, size: int) -> None:
    """The file's blocks, allocated: a full disk is ENOSPC here, not SIGBUS when a mapped page
    is first written. Where the file system or the OS cannot (macOS has no posix_fallocate),
    the file is only extended, and a full disk kills the stack (its state on disk stays whole)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except (AttributeError, OSError) as e:
        if isinstance(e, OSError) and e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, max(size, os.fstat(fd).st_size))


class Log:
    """An append-only file of frames (header, pickled payload), mapped into memory: appending
    copies the frame into the file's pages, which are the kernel's page cache and outlive a
    `kill -9`. No system call per snapshot: each one would hand the interpreter to the request
    threads, and the requests waiting for this snapshot would wait that much longer (measured:
    a write per snapshot cost 1.6 ms of such waits, a copy ~20 us). The payload is copied
    before its header, so a frame cut short has no header or a wrong CRC."""

    GROW = 4 << 20  # the file grows by doubling, from this; allocated, so a full disk is an error

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "w+b")  # noqa: SIM115 - open as long as the log is current
        self.map: mmap.mmap | None = None
        self.capacity = self.length = 0

    def _reserve(self, size: int) -> None:
        if self.length + size <= self.capacity:
            return
        capacity = max(self.GROW, 2 * self.capacity)
        while capacity < self.length + size:
            capacity *= 2
        _allocate(self.file.fileno(), capacity)
        if self.map is not None:
            self.map.close()
        self.map = mmap.mmap(self.file.fileno(), capacity)
        self.capacity = capacity

    def append(self, payload: bytes) -> int:
        total = FRAME.size + len(payload)
        self._reserve(total)
        at = self.length
        self.map[at + FRAME.size : at + total] = payload
        self.map[at : at + FRAME.size] = FRAME.pack(len(payload), _crc(payload))
        self.length += total
        return total

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
        self.file.close()


class Store:
    """moto's state in a folder: a log of snapshots, each one frame holding the services changed
    since the last (and the S3 keys and SQS messages changed: the journals' records), and
    `manifest.json` naming the log. A log begins with a frame holding everything: the first
    snapshot of a process starts a new one, as does a log grown past COMPACT_AT and four times
    its first frame; replacing the manifest (rename) makes it current. Restoring reads the
    frames up to the first one cut short, so what is on disk is always one point in time."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.blobs = Blobs(folder / "blobs")
        self.refs: dict[str, set[str]] = {}  # blobs each service's latest pickle refers to
        self.manifest = self._read_manifest()
        self.journal = KeyJournal(self.blobs)
        self.messages = MessageJournal()
        self.log: Log | None = None  # None: the next snapshot starts a new log
        self.base = 0  # bytes of the log's first frame
        self.snapshots = 0
        current = {self.manifest.get("log"), *self.manifest.get("files", {}).values()}
        current |= {(self.manifest.get(j) or {}).get("file") for j in ("journal", "messages")}
        self._drop_files_but(current)  # what a crash cut short

    def _drop_files_but(self, keep: set) -> None:
        """Delete the state files (logs, the per-service layout's) the manifest does not name."""
        for path in [*self.folder.glob("*.pickle"), *self.folder.glob("*.journal")]:
            if path.name not in keep:
                path.unlink(missing_ok=True)

    def _read_manifest(self) -> dict:
        path = self.folder / "manifest.json"
        if path.exists():
            return json.loads(path.read_text())
        return {"generation": 0}

    def write(self, names: frozenset[str] | set[str] = SERVICES) -> int:
        """Pickle the backends `names` (all, when a new log begins) and make them current;
        returns the bytes written."""
        return self.put(self.pickle(names))

    def pickle(self, names: frozenset[str] | set[str]) -> dict:
        """The backends `names` pickled (every one when a new log begins): the part of a
        snapshot that must not overlap a request."""
        compact = (
            self.log is None
            or self.journal.epoch != _epoch[0]  # objects' metadata may have changed in place
            or self.log.length > max(COMPACT_AT, 4 * self.base)
        )
        services: dict[str, bytes] = {}
        out = {"compact": compact, "services": services, KEYS: None, MESSAGES: None}
        names = SERVICES if compact else names
        # the keys and messages that changed go to the journals' records (a plain upload marks
        # only KEYS, a send only MESSAGES); S3 and SQS are pickled without them
        if KEYS in names or "s3" in names:
            out[KEYS] = self.journal.collect(compact)
        if MESSAGES in names or "sqs" in names:
            out[MESSAGES] = self.messages.collect(compact)
        journaled = {"s3": self.journal.stores, "sqs": self.messages.queues}
        for name in sorted(names & SERVICES):
            backends = _backends(name)
            state = {acct: dict(regions.items()) for acct, regions in list(backends.items())}
            for attempt in range(5):  # an internal thread may change a dict while it is pickled
                try:
                    buf = io.BytesIO()
                    self.blobs.referenced = set()
                    _Pickler(buf, self.blobs, journaled.get(name)).dump(state)
                    break
                except RuntimeError:
                    if attempt == 4:
                        raise
            self.refs[name] = self.blobs.referenced
            services[name] = buf.getvalue()
        return out

    def put(self, snap: dict) -> int:
        """Write a snapshot `pickle` took: the S3 bytes it named, then its frame (to a new log,
        then the manifest naming it, when it holds everything); returns the frame's bytes."""
        self.blobs.flush()
        keys, batch = snap[KEYS], snap[MESSAGES]
        frame = {"services": snap["services"], KEYS: keys and keys["data"]}
        frame[MESSAGES] = batch and batch["data"]
        payload = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            size = self._new_log(payload) if snap["compact"] else self.log.append(payload)
        except BaseException:
            if self.log is not None:  # its end may hold half a frame: start a new log
                self.log.close()
                self.log = None
            raise
        if keys:
            self.journal.written(keys)
        if batch:
            self.messages.written(batch)
        self.snapshots += 1
        if snap["compact"] or self.snapshots % 100 == 0:  # a scan of every blob: now and then
            self.blobs.keep_only(set().union(*self.refs.values(), self.journal.referenced()))
        return size

    def _new_log(self, payload: bytes) -> int:
        gen = self.manifest.get("generation", 0) + 1
        name = f"log-{gen}.journal"
        log = Log(self.folder / name)
        try:
            size = log.append(payload)
            manifest = {"generation": gen, "log": name}
            tmp = self.folder / "manifest.tmp"
            tmp.write_text(json.dumps(manifest))
            tmp.replace(self.folder / "manifest.json")
        except BaseException:
            log.close()
            raise
        if self.log is not None:
            self.log.close()
        self.log, self.manifest, self.base = log, manifest, size
        self._drop_files_but({name})  # earlier logs (and the per-service layout's files)
        return size

    def restore(self) -> bool:
        """Load every backend from the current log; False when there is none."""
        services, keys, messages = self._read()
        for name, data in services.items():
            _install(name, _Unpickler(io.BytesIO(data), self.blobs).load())
        self.journal.replay(_records(keys))
        self.messages.replay(_records(messages))
        return bool(services)

    def _read(self) -> tuple[dict[str, bytes], list[bytes], list[bytes]]:
        """Each service's latest pickle, and the key and message records, in order."""
        services: dict[str, bytes] = {}
        keys: list[bytes] = []
        messages: list[bytes] = []
        if "log" in self.manifest:
            for payload in _frames(self.folder / self.manifest["log"]):
                frame = pickle.loads(payload)
                services.update(frame["services"])
                keys += [frame[KEYS]] if frame[KEYS] else []
                messages += [frame[MESSAGES]] if frame[MESSAGES] else []
            return services, keys, messages
        # the layout before the log: a file per snapshot, journals of a recorded length
        loaded: dict[str, dict] = {}
        for name, filename in self.manifest.get("files", {}).items():
            if filename not in loaded:
                loaded[filename] = pickle.loads((self.folder / filename).read_bytes())
            services[name] = loaded[filename][name]
        for entry, out in (("journal", keys), ("messages", messages)):
            current = self.manifest.get(entry)
            if current:
                with open(self.folder / current["file"], "rb") as f:
                    out.append(f.read(current["length"]))
        return services, keys, messages


def _install(name: str, state: dict) -> None:
    backends = _backends(name)
    for acct, regions in state.items():
        for region, backend in regions.items():
            backends[acct][region] = backend


def snapshot(folder: Path) -> int:
    """Write every backend's state to `folder`; returns the bytes written."""
    return Store(folder).write()


def restore(folder: Path) -> list[str]:
    """Load the backends from `folder` (or from a single `moto.pickle` beside it, as stacks
    before this layout wrote it); returns the ARNs of the executions aborted because they were
    running."""
    legacy = folder.parent / "moto.pickle"
    if not Store(folder).restore():
        if not legacy.exists():
            return []
        with open(legacy, "rb") as f:
            state = _Unpickler(f, Blobs(folder / "blobs")).load()
        by_module = {f"{module}.{attr}": name for name, module, attr in BACKENDS}
        for key, value in state.items():
            _install(by_module[key], value)
    _release_in_flight()
    return _abort_running()


def _abort_running() -> list[str]:
    from moto.stepfunctions.parser.api import ExecutionStatus
    from moto.stepfunctions.parser.models import stepfunctions_parser_backends

    aborted = []
    for regions in stepfunctions_parser_backends.values():
        for backend in regions.values():
            for machine in backend.state_machines:
                for ex in machine.executions:
                    if ex.exec_status == ExecutionStatus.RUNNING:
                        ex.exec_status = ExecutionStatus.ABORTED
                        ex.stop_date = datetime.now(UTC)
                        ex.error = "States.Aborted"
                        ex.cause = (
                            "the local stack stopped while this execution ran; start it again"
                        )
                        aborted.append(ex.exec_arn)
    return aborted


def _release_in_flight() -> None:
    """Messages received by consumers that died with the stack are visible again."""
    from moto.sqs.models import sqs_backends

    for regions in sqs_backends.values():
        for backend in regions.values():
            for q in backend.queues.values():
                for m in q._messages:
                    m.visible_at = 0.0
