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

import functools
import hashlib
import importlib
import io
import json
import pickle
import threading
import weakref
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
# what a request to one service also changes in others (moto notifies in-process)
ALSO_CHANGES = {"s3": {"sqs", "sns", "events"}, "sns": {"sqs"}}
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
    """S3 objects' bytes, one file per distinct content (moto's objects never change in place)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.referenced: set[str] = set()
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
                path = self.folder / digest
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(value)
                tmp.replace(path)
                self.stored.add(digest)
            key.__dict__["_sluice_blob"] = digest
        self.referenced.add(digest)
        return digest

    def read(self, digest: str) -> bytes:
        return (self.folder / digest).read_bytes()

    def keep_only(self, digests: set[str]) -> int:
        """Delete the blobs no snapshot refers to any more; returns how many."""
        gone = self.stored - digests
        for digest in gone:
            (self.folder / digest).unlink(missing_ok=True)
        self.stored -= gone
        return len(gone)


KEYS = "s3 keys"  # a snapshot's entry for the key journal's records
MESSAGES = "sqs messages"  # and for the message journal's

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


class _Journal:
    """An append-only file of pickled records. The manifest records the file and how many bytes
    of it are current, so a record cut short by a crash is never read; rewritten whole when a
    subclass asks (then the old file is dropped once the manifest no longer names it)."""

    prefix = "journal"

    def __init__(self, folder: Path, current: dict | None):
        current = current or {}
        self.folder = folder
        self.file: str | None = current.get("file")
        self.length: int = current.get("length", 0)
        self.records: int = current.get("records", 0)
        self.obsolete: str | None = None

    def _append(self, data: bytes, records: int, rewrite: bool, generation: int) -> dict:
        """Append (or rewrite the file with) `records` records; what the manifest records."""
        if rewrite or self.file is None:
            self.obsolete, self.file = self.file, f"{self.prefix}-{generation}.journal"
            (self.folder / self.file).write_bytes(data)
            self.length, self.records = len(data), 0
        else:
            with open(self.folder / self.file, "r+b") as f:
                f.truncate(self.length)  # past it: what a failed write left
                f.seek(self.length)
                f.write(data)
            self.length += len(data)
        self.records += records
        return {"file": self.file, "length": self.length, "records": self.records}

    def _read(self):
        """The current records, in order."""
        if not self.file:
            return
        with open(self.folder / self.file, "rb") as f:
            data = io.BytesIO(f.read(self.length))
        while data.tell() < self.length:
            yield pickle.load(data)

    def drop_obsolete(self) -> None:
        if self.obsolete:
            (self.folder / self.obsolete).unlink(missing_ok=True)
            self.obsolete = None


class KeyJournal(_Journal):
    """S3 objects' metadata as an append-only file of (bucket, key name, the name's versions
    pickled, or None once it is gone) records. Each snapshot appends the names changed since
    the last (tracked as moto changes them). Rewritten whole on the first snapshot of a process,
    after a request that may change objects in place (tags, ACL: `objects_changed`), and when it
    holds more than twice as many records as live names."""

    prefix = "keys"

    def __init__(self, folder: Path, blobs: Blobs, current: dict | None):
        super().__init__(folder, current)
        self.blobs = blobs
        self.dirty: set[tuple[int, str]] = set()  # (id of a bucket's key store, key name)
        self.pending: set[tuple[int, str]] = set()  # taken by a snapshot not on disk yet
        self.live: dict[tuple[tuple[str, str], str], frozenset[str]] = {}  # -> its blobs
        self.epoch: int | None = None  # None: rewrite at the next snapshot
        self.stores: dict[int, tuple[tuple[str, str], object]] = {}
        _journals.add(self)
        track_key_changes()

    def collect(self) -> dict:
        """This snapshot's records (taken while no request applies): the names changed since the
        last one, or every live name when the journal is rewritten."""
        self.stores = {
            id(bucket.keys): ((bucket.account_id, bucket.name), bucket.keys)
            for regions in _backends("s3").values()
            for backend in regions.values()
            for bucket in list(backend.buckets.values())
        }
        taken, self.dirty = self.dirty, set()
        self.pending |= taken
        rewrite = self.epoch != _epoch[0] or self.records > 2 * len(self.live) + 1000
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

    def write(self, batch: dict, generation: int) -> dict:
        """Append the records (or rewrite the file with them); what the manifest records."""
        if batch["rewrite"] or self.file is None:
            self.live = {}
        state = self._append(batch["data"], len(batch["live"]), batch["rewrite"], generation)
        for key, refs in batch["live"].items():
            if refs is None:
                self.live.pop(key, None)
            else:
                self.live[key] = refs
        self.epoch, self.pending = batch["epoch"], set()
        return state

    def referenced(self) -> set[str]:
        return set().union(*self.live.values())

    def replay(self) -> None:
        """Fill the key stores the S3 pickle left empty (`_journaled_store`) with each name's
        last record (earlier ones may name blobs deleted since)."""
        last: dict[tuple[tuple[str, str], str], bytes | None] = {}
        for bucket, name, payload in self._read():
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


class MessageJournal(_Journal):
    """SQS messages as an append-only file of (queue, message id, the message pickled, or None
    once deleted) records. Each snapshot of SQS compares every message's stamp (what a send, a
    receive or a visibility change sets: `_message_bytes`) with the last one written and
    appends only the differences, in queue order, so a restored queue keeps its order.
    Rewritten whole on the first snapshot of a process and when it holds more than twice as
    many records as live messages."""

    prefix = "messages"

    def __init__(self, folder: Path, current: dict | None):
        super().__init__(folder, current)
        self.live: dict[tuple, tuple] | None = None  # (queue, id) -> stamp; None: rewrite next
        self.queues: dict[int, tuple[tuple[str, str, str], object]] = {}

    def collect(self) -> dict:
        """This snapshot's records (taken while no request applies)."""
        self.queues = {
            id(q): ((account, region, q.name), q)
            for account, regions in _backends("sqs").items()
            for region, backend in regions.items()
            for q in list(backend.queues.values())
        }
        rewrite = self.live is None or self.records > 2 * len(self.live) + 1000
        known = {} if rewrite else self.live  # rewrite: every message is written
        out, live, records = io.BytesIO(), {}, 0
        for queue, q in self.queues.values():
            for m in list(q._messages):
                stamp, data = _message_bytes(m)
                live[(queue, m.id)] = stamp
                if known.get((queue, m.id)) != stamp:
                    pickle.dump((queue, m.id, data), out, protocol=pickle.HIGHEST_PROTOCOL)
                    records += 1
        for gone in known.keys() - live.keys():
            pickle.dump((*gone, None), out, protocol=pickle.HIGHEST_PROTOCOL)
            records += 1
        return {"rewrite": rewrite, "data": out.getvalue(), "records": records, "live": live}

    def write(self, batch: dict, generation: int) -> dict:
        state = self._append(batch["data"], batch["records"], batch["rewrite"], generation)
        self.live = batch["live"]  # only once on disk: a failed write is diffed again
        return state

    def replay(self) -> None:
        """Fill the queues the SQS pickle left empty (`_journaled_queue`)."""
        from moto.sqs.models import Message

        by_queue: dict[tuple, dict[str, bytes]] = {}
        for queue, message_id, data in self._read():
            messages = by_queue.setdefault(queue, {})
            if data is None:
                messages.pop(message_id, None)
            else:
                messages[message_id] = data  # a changed message keeps its place
        for queue, q in _restoring_queues.items():
            q._messages = [_message_pickled(Message, d) for d in by_queue.get(queue, {}).values()]
        _restoring_queues.clear()


class _Pickler(pickle.Pickler):
    def __init__(self, file, blobs: Blobs | None, journaled: dict | None = None):
        from moto.s3.models import FakeKey
        from moto.s3.utils import _VersionedKeyStore
        from moto.sqs.models import Message, Queue
        from moto.utilities.tagging_service import TaggingService

        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.blobs = blobs
        # id of a key store -> (its bucket, the store); id of a queue -> (its key, the queue)
        self.journaled = journaled or {}
        self.queue_type = Queue
        self.references = 0  # blob references written
        self.key_type = FakeKey
        self.versions_type = _VersionedKeyStore
        self.tagging_type = TaggingService
        self.message_type = Message

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

    def persistent_id(self, obj):
        if type(obj) is _BlobRef:
            self.references += 1
            return ("blob", str(obj))
        return None

    def reducer_override(self, obj):
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

    def persistent_load(self, pid):
        kind, digest = pid
        if kind != "blob":
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")
        return self.blobs.read(digest)


def _backends(name: str):
    _, module, attr = next(b for b in BACKENDS if b[0] == name)
    return getattr(importlib.import_module(module), attr)


def changed_by(service: str) -> frozenset[str]:
    """The backends a request signed for `service` may change (all, if it is unknown)."""
    if service not in SERVICES:
        return SERVICES
    return frozenset({service, *ALSO_CHANGES.get(service, ())})


class Store:
    """moto's state in a folder: each snapshot one file holding the services changed since the
    last, and `manifest.json` naming the file with each service's latest state; replacing the
    manifest (rename) is what makes a snapshot current, so the files on disk are always one point
    in time."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.blobs = Blobs(folder / "blobs")
        self.refs: dict[str, set[str]] = {}  # blobs each service's current file refers to
        self.manifest = self._read_manifest()
        self.manifest_files = set(self.manifest["files"].values())
        self.journal = KeyJournal(folder, self.blobs, self.manifest.get("journal"))
        self.messages = MessageJournal(folder, self.manifest.get("messages"))
        current = self.manifest_files | {self.journal.file, self.messages.file}
        for path in [*self.folder.glob("*.pickle"), *self.folder.glob("*.journal")]:
            if path.name not in current:  # a crash cut short
                path.unlink(missing_ok=True)

    def _read_manifest(self) -> dict:
        path = self.folder / "manifest.json"
        if path.exists():
            return json.loads(path.read_text())
        return {"generation": 0, "files": {}}

    def write(self, names: frozenset[str] | set[str] = SERVICES) -> int:
        """Pickle the backends `names` (and any not on disk yet) and make them current; returns
        the bytes written."""
        return self.put(self.pickle(names))

    def pickle(self, names: frozenset[str] | set[str]) -> dict[str, bytes]:
        """The backends `names` (and any not on disk yet), pickled: the part of a snapshot that
        must not overlap a request (S3 bytes not stored yet are stored on the way)."""
        out: dict = {}
        for name in sorted(set(names) | (SERVICES - set(self.refs))):
            backends = _backends(name)
            state = {acct: dict(regions.items()) for acct, regions in list(backends.items())}
            journaled = None
            if name == "s3":  # buckets without their keys; the keys that changed, to the journal
                out[KEYS] = self.journal.collect()
                journaled = self.journal.stores
            if name == "sqs":  # queues without their messages; the messages that changed
                out[MESSAGES] = self.messages.collect()
                journaled = self.messages.queues
            for attempt in range(5):  # an internal thread may change a dict while it is pickled
                try:
                    buf = io.BytesIO()
                    self.blobs.referenced = set()
                    _Pickler(buf, self.blobs, journaled).dump(state)
                    break
                except RuntimeError:
                    if attempt == 4:
                        raise
            self.refs[name] = self.blobs.referenced
            out[name] = buf.getvalue()
        return out

    def put(self, pickles: dict[str, bytes]) -> int:
        """Write the pickles as one file, then the manifest that makes them current; then drop
        the files no service is read from any more. (One file, few system calls: each one lets
        the request threads take the interpreter, and the requests waiting for this snapshot
        wait that much longer.)"""
        gen = self.manifest["generation"] + 1
        files = dict(self.manifest["files"])
        pickles = dict(pickles)
        keys = pickles.pop(KEYS, None)
        journal = self.journal.write(keys, gen) if keys else self.manifest.get("journal")
        batch = pickles.pop(MESSAGES, None)
        messages = self.messages.write(batch, gen) if batch else self.manifest.get("messages")
        data = pickle.dumps(pickles, protocol=pickle.HIGHEST_PROTOCOL)
        name = f"snapshot-{gen}.pickle"
        (self.folder / name).write_bytes(data)
        files.update(dict.fromkeys(pickles, name))
        manifest = {"generation": gen, "files": files, "journal": journal, "messages": messages}
        tmp = self.folder / "manifest.tmp"
        tmp.write_text(json.dumps(manifest))
        tmp.replace(self.folder / "manifest.json")
        self.manifest = manifest
        for old in set(self.manifest_files) - set(files.values()):
            (self.folder / old).unlink(missing_ok=True)
        self.manifest_files = set(files.values())
        self.journal.drop_obsolete()
        self.messages.drop_obsolete()
        if (keys and keys["rewrite"]) or gen % 100 == 0:  # a scan of every blob: now and then
            self.blobs.keep_only(set().union(*self.refs.values(), self.journal.referenced()))
        return len(data) + sum(len(b["data"]) for b in (keys, batch) if b)

    def restore(self) -> bool:
        """Load every backend from the current files; False when there are none."""
        by_file: dict[str, list[str]] = {}
        for name, filename in self.manifest["files"].items():
            by_file.setdefault(filename, []).append(name)
        for filename, names in by_file.items():
            pickles = pickle.loads((self.folder / filename).read_bytes())
            for name in names:
                _install(name, _Unpickler(io.BytesIO(pickles[name]), self.blobs).load())
        self.journal.replay()
        self.messages.replay()
        return bool(by_file)


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
