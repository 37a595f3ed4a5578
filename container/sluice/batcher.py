"""Scoring with plain torch (faster than vLLM's prompt log-probs on CPUs), batched across requests.

Request threads tokenise their records and submit the jobs; one model thread takes whatever has
arrived (waiting up to `max_wait_s` for more once it has work), runs it as one set of micro-batches
(`scoring.score_ids`), and hands each request its own results. Generation never comes here: vLLM
batches it continuously (engine.py).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future

import torch

from .engine import DEADLINE_MESSAGE, EngineConfig, Job, error_result, score_result
from .scoring import score_ids

log = logging.getLogger(__name__)


class TorchScorer:
    """`score` records through the Hugging Face model, in micro-batches under a token budget."""

    def __init__(self, model, tokenizer, context: int, config: EngineConfig):
        self.model, self.tok, self.context, self.config = model.eval(), tokenizer, context, config
        self.device = next(model.parameters()).device
        pad = tokenizer.pad_token_id
        self.pad = pad if pad is not None else tokenizer.eos_token_id

    @torch.inference_mode()
    def run(self, jobs: list[Job]) -> None:
        """Fill job.result for every job; past-deadline jobs get their error line."""
        now = time.monotonic()
        live = []
        for j in jobs:
            if j.deadline < now:
                j.result = error_result(j.record, "deadline_exceeded", DEADLINE_MESSAGE)
            else:
                live.append(j)
        # score_ids sorts and micro-batches internally; chunk only to bound one call's memory
        chunk = 2048
        for start in range(0, len(live), chunk):
            self._guard(live[start : start + chunk])

    def _guard(self, jobs: list[Job]) -> None:
        """One call; out of memory halves it, any other failure is these records' error lines."""
        try:
            scores = score_ids(
                self.model,
                [j.ids for j in jobs],
                self.pad,
                self.context,
                self.config.token_budget,
                per_token=any(j.record.params.get("per_token") for j in jobs),
                logits_bytes=self.config.logits_mb * 2**20,
            )
            for j, s in zip(jobs, scores, strict=True):
                j.result = score_result(j, s, self.tok)
        except torch.OutOfMemoryError:
            if len(jobs) > 1:  # one oversized batch must not fail the file
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                self._guard(jobs[: len(jobs) // 2])
                self._guard(jobs[len(jobs) // 2 :])
                return
            for j in jobs:
                j.result = error_result(j.record, "out_of_memory", "record too large for memory")
        except Exception as e:
            for j in jobs:
                j.result = error_result(j.record, "internal_error", f"{type(e).__name__}: {e}")


class Batcher:
    def __init__(self, engine: TorchScorer, max_wait_s: float = 0.005, max_jobs: int = 8192):
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
