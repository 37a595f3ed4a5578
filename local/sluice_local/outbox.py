"""Work the local stack accepted but has not finished: events on the bus, asynchronous Lambda
invocations. On AWS both are durable once accepted (EventBridge and Lambda's async queue retry
for hours); here each item is a file from the moment it is accepted until its work is done, and
a start after a crash (`kill -9`) queues the leftovers again. Delivery is therefore at least
once, as on AWS: the consumers (report writers, job starters) are idempotent.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path


class Outbox:
    def __init__(self, folder: Path):
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.started = self._id()  # items before it are a previous run's

    def add(self, item: dict) -> str:
        """Keep `item` until `done`; returns its id (ordered by acceptance)."""
        oid = self._id()
        self.update(oid, item)
        return oid

    @staticmethod
    def _id() -> str:
        return f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"

    def update(self, oid: str, item: dict) -> None:
        path = self.folder / f"{oid}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(item))
        tmp.replace(path)

    def done(self, oid: str | None) -> None:
        if oid is not None:
            (self.folder / f"{oid}.json").unlink(missing_ok=True)

    def pending(self) -> list[tuple[str, dict]]:
        """What a previous run accepted and did not finish, oldest first. This run's own items
        are not (its threads already work on them and may finish one while this reads)."""
        out = []
        for path in sorted(self.folder.glob("*.json")):
            if path.stem >= self.started:
                continue
            try:
                out.append((path.stem, json.loads(path.read_text())))
            except FileNotFoundError:  # done meanwhile
                continue
            except ValueError:  # cannot happen with rename, but never stop a start over it
                path.unlink(missing_ok=True)
        return out
