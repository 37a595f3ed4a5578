"""moto's state on disk, so stopping the local stack and starting it again loses nothing.

moto keeps each service's state in backend objects; they are pickled (as LocalStack persists
the same backends), with what cannot be pickled (locks, threads, running interpreters) replaced by
fresh equivalents. Snapshots are written atomically, every few seconds and at shutdown.
Executions that were running when the stack stopped cannot resume mid-flight: on restore they
are marked ABORTED with the reason, which the retrain guard and the execution events then see.
"""

from __future__ import annotations

import importlib
import io
import pickle
import threading
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

# (module, attribute) of every backend the local stack uses.
BACKENDS = [
    ("moto.s3.models", "s3_backends"),
    ("moto.sqs.models", "sqs_backends"),
    ("moto.sns.models", "sns_backends"),
    ("moto.dynamodb.models", "dynamodb_backends"),
    ("moto.ssm.models", "ssm_backends"),
    ("moto.events.models", "events_backends"),
    ("moto.stepfunctions.parser.models", "stepfunctions_parser_backends"),
    ("moto.cloudwatch.models", "cloudwatch_backends"),
    ("moto.logs.models", "logs_backends"),
    ("moto.kms.models", "kms_backends"),
    ("moto.iam.models", "iam_backends"),
    ("moto.scheduler.models", "scheduler_backends"),
    ("moto.applicationautoscaling.models", "applicationautoscaling_backends"),
]
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


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
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


def _backend_dicts():
    for module, attr in BACKENDS:
        yield f"{module}.{attr}", getattr(importlib.import_module(module), attr)


def snapshot(path: Path) -> int:
    """Write every backend's state to `path` (atomically); returns the bytes written."""
    state = {}
    for name, backends in _backend_dicts():
        state[name] = {acct: dict(regions.items()) for acct, regions in list(backends.items())}
    buf = io.BytesIO()
    for attempt in range(5):  # a request may change a dict while it is pickled: try again
        try:
            buf = io.BytesIO()
            _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
            break
        except RuntimeError:
            if attempt == 4:
                raise
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)
    return len(buf.getvalue())


def restore(path: Path) -> list[str]:
    """Load the backends from `path`; returns the ARNs of the executions aborted because they
    were running."""
    if not path.exists():
        return []
    state = pickle.loads(path.read_bytes())
    for name, backends in _backend_dicts():
        for acct, regions in state.get(name, {}).items():
            for region, backend in regions.items():
                backends[acct][region] = backend
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
