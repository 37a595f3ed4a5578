"""Dynamic batching across requests: one model thread, many request threads.

Request threads tokenise their records and submit the jobs; the model thread takes whatever has
arrived (waiting up to `max_wait_s` for more once it has work), runs it as one set of device
batches, and hands each request its own results. With MaxConcurrentTransforms > 1 or endpoint
traffic, records of several requests share device batches; a single request loses nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future

from .engine import Engine, Job

log = logging.getLogger(__name__)


class Batcher:
    def __init__(self, engine: Engine, max_wait_s: float = 0.005, max_jobs: int = 8192):
        self.engine = engine
        self.max_wait_s = max_wait_s
        self.max_jobs = max_jobs
        self._queue: queue.Queue[tuple[list[Job], Future] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="model", daemon=True)
        self.merged_requests = 0  # how many device rounds served more than one request
        self._thread.start()

    def submit(self, jobs: list[Job]) -> Future:
        fut: Future = Future()
        if not jobs:
            fut.set_result(jobs)
        else:
            self._queue.put((jobs, fut))
        return fut

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _take(self) -> list[tuple[list[Job], Future]] | None:
        first = self._queue.get()
        if first is None:
            return None
        items, n = [first], len(first[0])
        deadline = time.monotonic() + self.max_wait_s
        while n < self.max_jobs:
            left = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # let the loop see it after this round
                break
            items.append(item)
            n += len(item[0])
        return items

    def _loop(self) -> None:
        while True:
            items = self._take()
            if items is None:
                return
            jobs = [j for js, _ in items for j in js]
            if len(items) > 1:
                self.merged_requests += 1
            try:
                self.engine.run(jobs)
            except Exception as e:  # the engine reports per record; this is a last resort
                log.exception("model round failed")
                for _, fut in items:
                    fut.set_exception(e)
                continue
            for js, fut in items:
                fut.set_result(js)
