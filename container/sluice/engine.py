"""The inference engine behind `serve`: generate, score and next_token over micro-batches.

Records are tokenised once, sorted by length and grouped into micro-batches under a token budget
(padding is what wastes compute), run under `torch.inference_mode`, and their results put back in
input order. Generation is a KV-cached loop over a left-padded batch in which every row keeps its
own parameters and, when sampling, its own random generator: a record's output does not depend on
which other records share its batch.
"""

from __future__ import annotations

import inspect
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .evaluate import context_length
from .records import Record
from .scoring import encode_for_scoring, score_ids


@dataclass
class Job:
    """One record, tokenised, waiting for the model."""

    record: Record
    ids: list[int]
    deadline: float = math.inf
    result: dict | None = None


@dataclass
class EngineConfig:
    token_budget: int = 16384  # padded tokens per micro-batch (rows x longest row)
    max_rows: int = 256
    default_max_new_tokens: int = 32
    truncation: str = "left"
    logits_mb: int = 32  # cap on one micro-batch's float32 logits when scoring

    @classmethod
    def from_env(cls, device: torch.device, defaults: dict | None = None) -> EngineConfig:
        budget = 65536 if device.type == "cuda" else 16384
        return cls(
            token_budget=int(os.environ.get("SLUICE_TOKEN_BUDGET", budget)),
            max_rows=int(os.environ.get("SLUICE_MAX_ROWS", 512 if device.type == "cuda" else 256)),
            default_max_new_tokens=int((defaults or {}).get("max_new_tokens", 32)),
            truncation=os.environ.get("SLUICE_TRUNCATION", "left"),
            logits_mb=int(
                os.environ.get("SLUICE_LOGITS_MB", 1024 if device.type == "cuda" else 32)
            ),
        )


def micro_batches(costs: list[tuple[int, int]], budget: int, max_rows: int) -> list[list[int]]:
    """Group (key, length) pairs, sorted by length, so rows x longest <= budget."""
    order = sorted(range(len(costs)), key=lambda i: costs[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        grown = max(longest, costs[i][1])
        if current and (len(current) + 1 > max_rows or (len(current) + 1) * grown > budget):
            batches.append(current)
            current, grown = [], costs[i][1]
        current.append(i)
        longest = grown
    if current:
        batches.append(current)
    return batches


def _id_fields(rec: Record) -> dict:
    return {"id": rec.id} if rec.has_id else {}


def error_result(rec: Record, code: str, message: str) -> dict:
    return {**_id_fields(rec), "error": {"code": code, "message": message}}


@dataclass
class Row:
    """One sequence being generated (a record may have several: num_return_sequences)."""

    job: int
    prompt: list[int]
    max_new: int
    sample: bool
    temperature: float
    top_k: int
    top_p: float
    stop: list[str]
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprob: float = 0.0
    finish: str | None = None
    text: str | None = None


class Engine:
    def __init__(self, model, tokenizer, config: EngineConfig | None = None):
        self.model = model.eval()
        self.tok = tokenizer
        self.device = next(model.parameters()).device
        self.context = context_length(model)
        self.config = config or EngineConfig()
        self.eos = tokenizer.eos_token_id
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos
        # prefill needs only the last position's logits (most causal LMs accept this)
        params = inspect.signature(model.forward).parameters
        self.last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._strs: dict[int, str] = {}

    def token_str(self, i: int) -> str:
        """One token's text, decoded once (next_token and per-token scores ask for many)."""
        s = self._strs.get(i)
        if s is None:
            s = self._strs[i] = self.tok.decode([i])
        return s

    # --- preparation (request threads) ---------------------------------------------------------

    def prepare(self, records: list[Record], deadline: float = math.inf) -> list[Job | dict]:
        """Tokenise a window of records at once; too-long inputs become error results."""
        out: list[Job | dict] = []
        score = [r for r in records if r.task == "score"]
        other = [r for r in records if r.task != "score"]
        ids: dict[int, list[int]] = {}
        if score:
            for r, s in zip(
                score, encode_for_scoring(self.tok, [r.text for r in score]), strict=True
            ):
                ids[r.index] = s
        if other:
            enc = self.tok([r.text for r in other])["input_ids"]
            for r, s in zip(other, enc, strict=True):
                ids[r.index] = s
        for r in records:
            job = self._fit(r, ids[r.index], deadline)
            out.append(job)
        return out

    def _fit(self, rec: Record, ids: list[int], deadline: float) -> Job | dict:
        policy = rec.params.get("truncation", self.config.truncation)
        if rec.task == "score":
            # long texts are scored in windows; only the error policy refuses them
            if policy == "error" and len(ids) > self.context:
                return error_result(
                    rec,
                    "too_long",
                    f"text has {len(ids)} tokens, the model's context is "
                    f"{self.context} (send truncation='left' to score it in windows)",
                )
            return Job(rec, ids, deadline)
        room = self.context
        if rec.task == "generate":
            room -= rec.params.get("max_new_tokens", self.config.default_max_new_tokens)
            if room < 1:
                return error_result(
                    rec,
                    "invalid_parameter",
                    f"max_new_tokens must be below the model's context of {self.context}",
                )
        if len(ids) > room:
            if policy == "error":
                return error_result(
                    rec,
                    "too_long",
                    f"prompt has {len(ids)} tokens; with max_new_tokens it must "
                    f"fit the model's context of {self.context} (or send truncation='left')",
                )
            ids = ids[-room:]
        if not ids:
            return error_result(rec, "empty_text", "the text has no tokens")
        return Job(rec, ids, deadline)

    # --- execution (the model thread) ------------------------------------------------------------

    @torch.inference_mode()
    def run(self, jobs: list[Job]) -> None:
        """Fill job.result for every job (grouped by task; each task micro-batched)."""
        now = time.monotonic()
        live = []
        for j in jobs:
            if j.deadline < now:
                j.result = error_result(
                    j.record,
                    "deadline_exceeded",
                    "the request's time budget ran out before this record was reached; "
                    "send fewer records per request (MaxPayloadInMB) or raise the timeout",
                )
            else:
                live.append(j)
        for task, fn in (
            ("score", self._score),
            ("next_token", self._next_token),
            ("generate", self._generate),
        ):
            group = [j for j in live if j.record.task == task]
            if group:
                fn(group)

    def _guard(self, jobs: list[Job], fn: Callable[[list[Job]], None]) -> None:
        """Run one micro-batch; a failure becomes error lines for its records, not a 500."""
        try:
            fn(jobs)
        except torch.OutOfMemoryError:
            if len(jobs) > 1:  # halve and retry: one oversized batch must not fail the file
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                mid = len(jobs) // 2
                self._guard(jobs[:mid], fn)
                self._guard(jobs[mid:], fn)
                return
            for j in jobs:
                j.result = error_result(j.record, "out_of_memory", "record too large for memory")
        except Exception as e:
            for j in jobs:
                j.result = error_result(j.record, "internal_error", f"{type(e).__name__}: {e}")

    def _score(self, jobs: list[Job]) -> None:
        per_token = any(j.record.params.get("per_token") for j in jobs)

        def run(batch: list[Job]) -> None:
            scores = score_ids(
                self.model,
                [j.ids for j in batch],
                self.pad,
                self.context,
                self.config.token_budget,
                per_token=per_token,
                logits_bytes=self.config.logits_mb * 2**20,
            )
            for j, s in zip(batch, scores, strict=True):
                res = {
                    **_id_fields(j.record),
                    "task": "score",
                    "logprob": s.logprob,
                    "mean_logprob": s.mean_logprob,
                    "perplexity": s.perplexity,
                    "tokens": s.tokens,
                }
                if j.record.params.get("per_token"):
                    res["token_logprobs"] = s.token_logprobs
                    res["token_strs"] = [self.token_str(t) for t in j.ids[1:]]
                j.result = res

        # score_ids sorts and micro-batches internally; chunk only to bound one call's memory
        chunk = max(1, self.config.max_rows * 8)
        for start in range(0, len(jobs), chunk):
            self._guard(jobs[start : start + chunk], run)

    def left_padded(self, seqs: list[list[int]]) -> tuple[torch.Tensor, ...]:
        """ids, attention mask and position ids of a left-padded batch (last tokens aligned)."""
        longest = max(map(len, seqs))
        ids = torch.tensor([[self.pad] * (longest - len(s)) + s for s in seqs], dtype=torch.long)
        mask = torch.tensor([[0] * (longest - len(s)) + [1] * len(s) for s in seqs])
        ids, mask = ids.to(self.device), mask.to(self.device)
        return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    def _next_token(self, jobs: list[Job]) -> None:
        def run(batch: list[Job]) -> None:
            ids, mask, pos = self.left_padded([j.ids for j in batch])
            logits = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                use_cache=False,
                **self.last_only,
            ).logits
            probs = logits[:, -1].float().softmax(-1)
            k_max = max(j.record.params.get("top_k", 5) for j in batch)
            top = torch.topk(probs, k_max, dim=-1)
            values, indices = top.values.cpu().tolist(), top.indices.cpu().tolist()
            for r, j in enumerate(batch):
                k = j.record.params.get("top_k", 5)
                j.result = {
                    **_id_fields(j.record),
                    "task": "next_token",
                    "next_tokens": [
                        {"token": self.token_str(i), "id": i, "prob": p}
                        for p, i in zip(values[r][:k], indices[r][:k], strict=True)
                    ],
                }

        costs = [(len(j.ids), len(j.ids)) for j in jobs]
        for b in micro_batches(costs, self.config.token_budget, self.config.max_rows):
            self._guard([jobs[i] for i in b], run)

    # --- generation ------------------------------------------------------------------------------

    def _rows(self, k: int, job: Job) -> list[Row]:
        p = job.record.params
        temperature = float(p.get("temperature", 1.0))
        explicit = any(n in p for n in ("temperature", "top_k", "top_p"))
        sample = bool(p.get("do_sample", explicit)) and temperature > 0
        rows = []
        for n in range(p.get("num_return_sequences", 1)):
            gen = None
            if sample:
                # per-row generator: a seeded record samples the same text in any batch
                gen = torch.Generator(device=self.device)
                seed = p.get("seed")
                gen.manual_seed(
                    (seed + n) % 2**63 if seed is not None else int.from_bytes(os.urandom(7))
                )
            rows.append(
                Row(
                    k,
                    job.ids,
                    p.get("max_new_tokens", self.config.default_max_new_tokens),
                    sample,
                    temperature,
                    int(p.get("top_k", 0)),
                    float(p.get("top_p", 1.0)),
                    p.get("stop", []),
                    gen,
                )
            )
        return rows

    def _generate(self, jobs: list[Job]) -> None:
        rows = [row for k, j in enumerate(jobs) for row in self._rows(k, j)]
        costs = [(r.max_new, len(r.prompt) + r.max_new) for r in rows]
        by_job: dict[int, list[Row]] = {}
        for b in micro_batches(costs, self.config.token_budget, self.config.max_rows):
            batch = [rows[i] for i in b]
            try:
                self._generate_batch(batch)
            except Exception as e:  # reported as error lines for these records below
                for r in batch:
                    r.finish, r.text = "error", f"{type(e).__name__}: {e}"
        for r in rows:
            by_job.setdefault(r.job, []).append(r)
        for k, j in enumerate(jobs):
            outs = by_job[k]
            if any(r.finish == "error" for r in outs):
                j.result = error_result(j.record, "internal_error", outs[0].text or "")
                continue
            gens = [
                {
                    "generated_text": r.text,
                    "tokens": len(r.tokens),
                    "finish_reason": r.finish,
                    "mean_logprob": r.logprob / len(r.tokens) if r.tokens else None,
                }
                for r in outs
            ]
            j.result = {**_id_fields(j.record), "task": "generate", **gens[0]}
            if len(gens) > 1:
                j.result["generations"] = gens

    def _pick(self, logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
        """Next token per row: argmax for greedy rows, a draw from the row's generator otherwise."""
        nxt = logits.argmax(-1)
        for i, r in enumerate(rows):
            if not r.sample:
                continue
            scores = logits[i].float() / r.temperature
            if r.top_k:
                kth = torch.topk(scores, min(r.top_k, scores.numel())).values[-1]
                scores = scores.masked_fill(scores < kth, -math.inf)
            if r.top_p < 1.0:
                sorted_scores, idx = torch.sort(scores, descending=True)
                cum = sorted_scores.softmax(-1).cumsum(-1)
                drop = cum - sorted_scores.softmax(-1) > r.top_p
                scores = scores.scatter(0, idx[drop], -math.inf)
            probs = scores.softmax(-1)
            nxt[i] = torch.multinomial(probs, 1, generator=r.generator)[0]
        return nxt

    def _generate_batch(self, rows: list[Row]) -> None:
        dev = self.device
        ids, mask, pos = self.left_padded([r.prompt for r in rows])
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **self.last_only
        )
        past, logits = out.past_key_values, out.logits[:, -1]
        next_pos = pos[:, -1:] + 1
        steps = max(r.max_new for r in rows)
        index = torch.arange(len(rows), device=dev)  # batch position -> row
        for step in range(steps):
            nxt = self._pick(logits, [rows[i] for i in index.tolist()])
            logp = logits.float().log_softmax(-1).gather(-1, nxt[:, None])[:, 0]
            nxt_l, logp_l = nxt.tolist(), logp.tolist()
            keep = []
            for b, i in enumerate(index.tolist()):
                r = rows[i]
                t = nxt_l[b]
                if t == self.eos:
                    r.finish = "eos"
                else:
                    r.tokens.append(t)
                    r.logprob += logp_l[b]
                    if r.stop and self._hit_stop(r):
                        r.finish = "stop"
                    elif len(r.tokens) >= r.max_new:
                        r.finish = "length"
                if r.finish is None:
                    keep.append(b)
            if not keep or step == steps - 1:
                break
            if len(keep) < len(index):
                # drop finished rows from the batch (and their KV cache) instead of computing on
                sel = torch.tensor(keep, device=dev)
                past.batch_select_indices(sel)
                index, nxt, mask, next_pos = index[sel], nxt[sel], mask[sel], next_pos[sel]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = self.model(
                input_ids=nxt[:, None],
                attention_mask=mask,
                position_ids=next_pos,
                past_key_values=past,
                use_cache=True,
            )
            past, logits = out.past_key_values, out.logits[:, -1]
            next_pos = next_pos + 1
        for r in rows:
            r.finish = r.finish or "length"
            if r.text is None:
                r.text = self.tok.decode(r.tokens, skip_special_tokens=True)

    def _hit_stop(self, r: Row) -> bool:
        text = self.tok.decode(r.tokens, skip_special_tokens=True)
        cut = min((text.find(s) for s in r.stop if s in text), default=-1)
        if cut < 0:
            return False
        r.text = text[:cut]
        return True
