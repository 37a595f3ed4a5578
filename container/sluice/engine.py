"""The inference engine behind `serve`: vLLM's async engine, fed record by record.

Request threads tokenise their records here (truncation policy, chat templates, error lines for what
cannot run) and submit each one to vLLM's engine, which runs on its own event loop thread: the
records of every request in flight join one continuously batched stream (paged KV cache), across
all GPUs of the instance (tensor parallel). Each record has its own `SamplingParams` (seed,
temperature, top-k/p, stop strings, n), so its output does not depend on its neighbours. A record
still running at the request's deadline is aborted in the engine and gets an error line; cancelling
a record's future (the client went away) aborts it too.

Scoring runs through vLLM's prompt log-probs on GPUs and through `scoring.TorchScorer` on CPUs,
where it measured faster (docs/benchmarks.md); `SLUICE_SCORE_ENGINE=vllm|torch` overrides.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import os
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from .errors import SluiceError
from .records import TRUNCATION, Record

log = logging.getLogger("sluice.engine")


@dataclass
class Job:
    """One record, tokenised, waiting for the model."""

    record: Record
    ids: list[int]
    deadline: float = math.inf
    result: dict | None = None
    truncated: int = 0  # tokens the truncation policy dropped


@dataclass
class EngineConfig:
    default_max_new_tokens: int = 32
    truncation: str = "left"
    token_budget: int = 16384  # torch scoring: padded tokens per micro-batch
    logits_mb: int = 32  # torch scoring: cap on one micro-batch's float32 logits

    @classmethod
    def from_env(cls, cuda: bool, defaults: dict | None = None) -> EngineConfig:
        return cls(
            default_max_new_tokens=int((defaults or {}).get("max_new_tokens", 32)),
            truncation=truncation_default(),
            token_budget=int(os.environ.get("SLUICE_TOKEN_BUDGET", 65536 if cuda else 16384)),
            logits_mb=int(os.environ.get("SLUICE_LOGITS_MB", 1024 if cuda else 32)),
        )


def truncation_default() -> str:
    """SLUICE_TRUNCATION: the policy of generate, chat and next_token records that set none."""
    value = os.environ.get("SLUICE_TRUNCATION", "left")
    if value not in TRUNCATION or value == "window":  # windows are for score records only
        raise SluiceError(f"SLUICE_TRUNCATION must be left, right or error, not {value!r}")
    return value


def _id_fields(rec: Record | None) -> dict:
    return {"id": rec.id} if rec is not None and rec.has_id else {}


def error_result(rec: Record | None, code: str, message: str) -> dict:
    return {**_id_fields(rec), "error": {"code": code, "message": message}}


ENGINE_FAILED_MESSAGE = (
    "the inference engine stopped (its log says why); the server exits so that SageMaker "
    "replaces it: send this record again"
)
DEADLINE_MESSAGE = (
    "the request's time budget ran out before this record finished; send fewer records per "
    "request (MaxPayloadInMB) or raise the timeout"
)


# --- preparation (request threads) -----------------------------------------------------------


def prepare(
    tok, context: int, config: EngineConfig, records: list[Record], deadline: float = math.inf
) -> list[Job | dict]:
    """Tokenise a window of records; what cannot run becomes its error result, in place."""
    from .scoring import encode_for_scoring

    ids: dict[int, list[int] | dict] = {}
    score = [r for r in records if r.task == "score"]
    plain = [r for r in records if r.task != "score" and r.messages is None]
    if score:
        for r, s in zip(score, encode_for_scoring(tok, [r.text for r in score]), strict=True):
            ids[r.index] = s
    if plain:
        for r, s in zip(plain, tok([r.text for r in plain])["input_ids"], strict=True):
            ids[r.index] = s
    for r in records:
        if r.messages is not None:
            ids[r.index] = _chat_ids(tok, r)
    out: list[Job | dict] = []
    for r in records:
        x = ids[r.index]
        out.append(x if isinstance(x, dict) else _fit(r, x, context, config, deadline))
    return out


def _chat_ids(tok, rec: Record) -> list[int] | dict:
    """The conversation rendered by the tokenizer's own chat template, ready for the reply."""
    if not getattr(tok, "chat_template", None):
        return error_result(
            rec,
            "no_chat_template",
            'this model\'s tokenizer has no chat template: send "text" instead of "messages"',
        )
    try:
        out = tok.apply_chat_template(rec.messages, add_generation_prompt=True, tokenize=True)
    except Exception as e:  # a template may refuse a conversation (e.g. roles out of order)
        return error_result(rec, "invalid_messages", f"the chat template refused them: {e}")
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


def _fit(
    rec: Record, ids: list[int], context: int, config: EngineConfig, deadline: float = math.inf
) -> Job | dict:
    """Apply the record's truncation policy: no record reaches the engine longer than the model
    allows. vLLM needs room for one generated token even to score (prompt log-probs) or to
    predict the next token, and for max_new_tokens to generate."""
    score = rec.task == "score"
    policy = rec.params.get("truncation") or ("window" if score else config.truncation)
    if score:
        room = context - 1
        if policy == "window" or len(ids) <= room:  # windows: scoring.windows, either engine
            return Job(rec, ids, deadline)
        what = "text"
    else:
        if policy == "window":
            return error_result(
                rec, "invalid_parameter", "truncation 'window' is for score records only"
            )
        default = config.default_max_new_tokens
        out = rec.params.get("max_new_tokens", default) if rec.generates else 1
        room = context - (out or 1)  # None: as many as the context leaves (OpenAI chat lines)
        if room < 1:
            return error_result(
                rec,
                "invalid_parameter",
                f"max_new_tokens must be below the model's context of {context}",
            )
        what = "prompt"
    if not score and not ids:
        return error_result(rec, "empty_text", "the text has no tokens")
    dropped = max(0, len(ids) - room)
    if dropped and policy == "error":
        need = "" if score else " with the tokens it asks for"
        return error_result(
            rec,
            "too_long",
            f"{what} has {len(ids)} tokens; {what}{need} must fit the model's context of "
            f"{context} ({room} tokens): send truncation 'left' or 'right'"
            + (" or 'window'" if score else ""),
        )
    if dropped:
        ids = ids[dropped:] if policy == "left" else ids[:room]
    if rec.generates and out is None:
        rec.params["max_new_tokens"] = context - len(ids)
    return Job(rec, ids, deadline, truncated=dropped)


def usage(job: Job, completion: int = 0) -> dict:
    """A line's token usage (OpenAI's names); `truncated` when the policy dropped tokens."""
    out = {
        "usage": {
            "prompt_tokens": len(job.ids),
            "completion_tokens": completion,
            "total_tokens": len(job.ids) + completion,
        }
    }
    if job.truncated:
        out["truncated"] = job.truncated
    return out


# --- vLLM ------------------------------------------------------------------------------------


def cpu_defaults() -> None:
    """vLLM's CPU backend settings for a machine the container has to itself (set unless given).

    All the cores the process may use compute (vLLM reserves one by default), and a KV cache of
    SLUICE_KV_CACHE_GB (default 1 GiB: ample for small models; allocating it costs start-up).
    """
    cores = sorted(os.sched_getaffinity(0))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", os.environ.get("SLUICE_KV_CACHE_GB", "1"))
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")


def tensor_parallel(gpus: int, heads: int) -> int:
    """The most GPUs (of those present) the attention heads divide evenly across."""
    return max((n for n in range(1, max(gpus, 1) + 1) if heads % n == 0), default=1)


async def _last(stream):
    """The last item an async iterator yields (vLLM's final output of a request)."""
    last = None
    async for out in stream:
        last = out
    return last


async def _cancel(task: asyncio.Task) -> None:
    """Cancel `task` and wait until it has ended."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


def sampling_params(rec: Record, default_max_new: int):
    """One record's `SamplingParams` (generate/chat, next_token, score)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    final = RequestOutputKind.FINAL_ONLY
    p = rec.params
    if rec.task == "next_token":
        k = p.get("top_k", 5)
        return SamplingParams(max_tokens=1, temperature=0, logprobs=k, output_kind=final)
    if rec.task == "score":
        return SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0, output_kind=final)
    sample = p.get("do_sample", False) and p.get("temperature", 1.0) > 0
    schema = p.get("json_schema")
    return SamplingParams(
        n=p.get("num_return_sequences", 1),
        max_tokens=p.get("max_new_tokens", default_max_new),
        temperature=p.get("temperature", 1.0) if sample else 0.0,
        top_k=p.get("top_k", 0) if sample else 0,
        top_p=p.get("top_p", 1.0) if sample else 1.0,
        seed=p.get("seed") if sample else None,
        repetition_penalty=p.get("repetition_penalty", 1.0),
        stop=p.get("stop") or None,
        logprobs=p.get("logprobs", 0),  # the chosen token's (mean_logprob), and top-k if asked
        # flat lists instead of a dict of Logprob objects per token: measured 17% → 8% of
        # generation time on a 14M model (docs/benchmarks.md)
        flat_logprobs=True,
        # guided decoding: only tokens that keep the answer valid under the schema
        structured_outputs=None if schema is None else StructuredOutputsParams(json=schema),
        output_kind=final,
    )


class VllmEngine:
    """vLLM's `AsyncLLM` on a private event loop; `submit` is safe from any thread."""

    def __init__(
        self,
        model_dir,
        tok,
        context: int,
        dtype: str,
        config: EngineConfig,
        adapter: Adapter | None = None,
        batch: bool = False,
        adapters: dict[str, Adapter] | None = None,
    ):
        self.tok, self.context, self.config, self.batch = tok, context, config, batch
        self.eos = tok.eos_token_id
        self.lora = None  # the LoRARequest every record runs with (lora_merge=false models)
        self.adapters = adapters or {}  # named adapters a record picks (multi-LoRA)
        self.loras: dict = {}  # adapter name -> its LoRARequest
        self._identity = None  # the zero adapter's folder (see lora.identity_adapter)
        self.failed: str | None = None  # why the engine died, once it has
        self._died = asyncio.Event()  # set with `failed`, on the engine's loop
        self.adapter = adapter
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vllm", daemon=True)
        self._thread.start()
        self.llm = asyncio.run_coroutine_threadsafe(
            self._start(str(model_dir), dtype), self.loop
        ).result()

    async def _start(self, model_dir: str, dtype: str):
        import torch
        from transformers import AutoConfig
        from vllm import AsyncEngineArgs
        from vllm.config import StructuredOutputsConfig
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        cuda = torch.cuda.is_available()
        if not cuda:
            cpu_defaults()
            # The model runs in the engine core's own process (AsyncLLM always starts one): vLLM's
            # CPU backend otherwise adds a worker process, another import of torch and vLLM
            # (docs/benchmarks.md: ready 12 s sooner, generation 1.10x, ~1.7 GB less). Here, not in
            # cpu_defaults: the benchmarks' vLLM-offline baseline keeps vLLM's own default.
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            # vLLM then runs torch on one thread in that process unless OMP_NUM_THREADS is given
            os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
        tp = 1
        if cuda:
            heads = _heads(AutoConfig.from_pretrained(model_dir))
            tp = tensor_parallel(torch.cuda.device_count(), heads)
        if self.adapter is None and self.adapters:  # base records get the zero adapter
            from .lora import identity_adapter

            self._identity = tempfile.TemporaryDirectory(prefix="sluice-identity-")
            first = next(iter(self.adapters.values()))
            self.adapter = Adapter(
                identity_adapter(first.path, Path(self._identity.name)), first.rank
            )
        lora = {}
        every = [*([self.adapter] if self.adapter else []), *self.adapters.values()]
        if every:
            from vllm.lora.request import LoRARequest

            lora = {
                "enable_lora": True,
                # adapters in one step (vLLM's slots); the rest wait in its CPU cache
                "max_loras": min(len(every), MAX_LORAS),
                "max_cpu_loras": len(every),
                "max_lora_rank": max(a.slot for a in every),
            }
            self.lora = LoRARequest("sluice", 1, str(self.adapter.path)) if self.adapter else None
            for i, (name, a) in enumerate(self.adapters.items(), start=2):
                self.loras[name] = LoRARequest(name, i, str(a.path))
        eager = os.environ.get("SLUICE_ENFORCE_EAGER", "0" if cuda else "1") == "1"
        if eager and not cuda:
            # vLLM still compiles a few sampler helpers with torch.compile (inductor: a C++
            # build) at the first request that asks for log-probs, which every generate record
            # does (mean_logprob): ~2.5 s per server start here. Eager, like the model.
            os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")  # read where torch is imported
            torch._dynamo.config.disable = os.environ["TORCH_COMPILE_DISABLE"] == "1"
        args = AsyncEngineArgs(
            model=model_dir,
            dtype=dtype,
            max_model_len=self.context,
            tensor_parallel_size=tp,
            # one worker runs inside the engine process: one process fewer to start
            distributed_executor_backend="uni" if tp == 1 else None,
            seed=0,
            max_logprobs=100,  # next_token's top_k goes up to 100
            # CPU: no graph capture or compilation (start-up in seconds, same throughput measured)
            enforce_eager=eager,
            gpu_memory_utilization=float(
                os.environ.get("SLUICE_GPU_MEMORY_UTILIZATION", "0.9" if cuda else "0.15")
            ),
            disable_log_stats=True,
            # structured output (json_schema): llguidance, the backend with the widest JSON Schema
            # support (vLLM's `auto` falls back to it from xgrammar), writing compact JSON: no
            # free whitespace, which small models fill a budget with (measured: `{` + 39 spaces)
            structured_outputs_config=StructuredOutputsConfig(
                backend="guidance", disable_any_whitespace=True
            ),
            **lora,
        )
        # vLLM sizes its running batch by usage: the offline `LLM` class gets throughput defaults
        # (CPU: 256 sequences, 4096 tokens a step), servers latency ones (128, 2048; an engine
        # built directly gets the latter too). Batch Transform is offline inference.
        usage = UsageContext.LLM_CLASS if self.batch else UsageContext.OPENAI_API_SERVER
        start = os.environ.get("VLLM_WORKER_MULTIPROC_METHOD")  # the operator's, if given
        config = args.create_engine_config(usage)
        if not cuda:
            # vLLM's CPU platform sets `spawn` while it builds the config: the engine process
            # then imports torch and vLLM all over again (~16 s of CPU here). Nothing in this
            # process holds what forking would break (no CUDA; torch has run no parallel op), so
            # the engine process is forked from it instead (docs/benchmarks.md: ready 44 -> 23 s)
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = start or "fork"
        llm = AsyncLLM.from_vllm_config(config, usage_context=usage, disable_log_stats=True)
        sched = llm.vllm_config.scheduler_config
        log.info(
            "vLLM engine: %s, dtype %s, tensor parallel %d, up to %d sequences and %d tokens a "
            "step, prefix caching %s, engine process %s%s",
            model_dir,
            dtype,
            args.tensor_parallel_size,
            sched.max_num_seqs,
            sched.max_num_batched_tokens,
            # records of one file often share an instruction prefix: its KV blocks are reused
            # (vLLM's default for generative models, CPUs included; on = it is really active)
            "on" if llm.vllm_config.cache_config.enable_prefix_caching else "off",
            # vLLM's default is fork where it does not need spawn (it then sets spawn itself)
            "forked"
            if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD", "fork") == "fork"
            else "spawned",
            f", LoRA adapter {self.adapter.path} (rank {self.adapter.rank})"
            if self.lora and self._identity is None
            else "",
        )
        if self.adapters:
            log.info(
                "%d LoRA adapters a record may name: %s",
                len(self.adapters),
                ", ".join(f"{n} (rank {a.rank})" for n, a in self.adapters.items()),
            )
        for name, req in self.loras.items():  # loaded now: a broken adapter fails the start
            try:
                await llm.add_lora(req)
            except Exception as e:
                llm.shutdown()
                raise SluiceError(f"adapter {name!r} ({req.lora_path}) does not load: {e}") from e
        return llm

    def close(self) -> None:
        llm, self.llm = self.llm, None
        try:
            # vLLM's shutdown stops the engine process before it cancels the task that reads the
            # engine's outputs, and that task then logs EngineDeadError with a traceback at every
            # clean stop: cancel the reader first, on its own loop
            reader = getattr(llm, "output_handler", None)
            if reader is not None and self.loop.is_running():
                cancelled = asyncio.run_coroutine_threadsafe(_cancel(reader), self.loop)
                with contextlib.suppress(Exception):
                    cancelled.result(timeout=10)
            llm.shutdown()
            # its __del__ would shut down again at interpreter exit, when vLLM's globals are gone
            llm.shutdown = lambda *a, **k: None
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)

    def submit(self, job: Job) -> concurrent.futures.Future:
        """Run one job; the future resolves once job.result is set. cancel() aborts it."""
        return asyncio.run_coroutine_threadsafe(self._run(job), self.loop)

    async def _run(self, job: Job) -> Job:
        from vllm.exceptions import VLLMClientError

        left = job.deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            work = self._score(job) if job.record.task == "score" else self._complete(job)
            job.result = await asyncio.wait_for(work, timeout=min(left, 1e9))
        except TimeoutError:  # wait_for cancelled the stream, and vLLM aborted the request
            job.result = error_result(job.record, "deadline_exceeded", DEADLINE_MESSAGE)
        except asyncio.CancelledError:
            job.result = error_result(job.record, "cancelled", "the client went away")
            raise
        except VLLMClientError as e:  # vLLM refused the request itself (an unsupported schema)
            job.result = error_result(job.record, "invalid_request", f"{type(e).__name__}: {e}")
        except Exception as e:  # one record's failure is its error line, never the request's
            if self._dead(e):
                job.result = error_result(job.record, "engine_failed", ENGINE_FAILED_MESSAGE)
                return job
            log.exception("record %d failed in the engine", job.record.index)
            job.result = error_result(job.record, "internal_error", f"{type(e).__name__}: {e}")
        return job

    def check(self) -> str | None:
        """Why the engine died, or None while it runs (vLLM notices its processes exiting)."""
        if self.llm is not None and self.llm.errored:
            self._fail("the vLLM engine process exited")
        return self.failed

    def _fail(self, reason: str) -> None:
        if self.failed is None:
            self.failed = reason
            log.error("the vLLM engine died (%s); the server stops", reason)
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing waits any more
                self.loop.call_soon_threadsafe(self._died.set)

    def _dead(self, e: Exception) -> bool:
        """Whether vLLM's engine is gone (its process crashed or was killed): every record from
        now on would fail, so `serve` answers what is in flight and exits (see `failed`)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        if not isinstance(e, EngineDeadError):
            return False
        self._fail(f"{type(e).__name__}: {e}")
        return True

    async def _final(self, ids: list[int], params, rec: Record):
        """The record's final output, or EngineDeadError once the engine has died: a request
        vLLM accepted just as its engine process died is never answered (its output reader is
        gone), so the record waits on the engine and on its death, whichever comes first."""
        from vllm.v1.engine.exceptions import EngineDeadError

        lora = self.loras[rec.adapter] if rec.adapter is not None else self.lora
        stream = self.llm.generate(
            {"prompt_token_ids": ids}, params, request_id=uuid.uuid4().hex, lora_request=lora
        )
        work = asyncio.ensure_future(_last(stream))
        died = asyncio.ensure_future(self._died.wait())
        try:
            done, _ = await asyncio.wait({work, died}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when this record is cancelled (deadline, client gone): vLLM aborts it
            died.cancel()
            if not work.done():
                work.cancel()
        if work in done:
            return work.result()
        raise EngineDeadError(f"the engine died ({self.failed})")

    async def _score(self, job: Job) -> dict:
        """Prompt log-probs, window by window for texts longer than the context.

        vLLM wants room for one generated token, so windows are one token shorter than torch
        scoring's: a text longer than the context gets slightly different context boundaries.
        """
        from .scoring import Score, windows

        params = sampling_params(job.record, 1)
        parts = windows(job.ids, self.context - 1)
        outs = await asyncio.gather(*(self._final(w, params, job.record) for w, _ in parts))
        steps = []
        for (w, first), out in zip(parts, outs, strict=True):
            steps += [out.prompt_logprobs[i][w[i]].logprob for i in range(first, len(w))]
        return score_result(job, Score(sum(steps), len(steps), steps), self.tok)

    async def _complete(self, job: Job) -> dict:
        rec = job.record
        out = await self._final(
            job.ids, sampling_params(rec, self.config.default_max_new_tokens), rec
        )
        if rec.task == "next_token":
            top = sorted(out.outputs[0].logprobs[0].items(), key=lambda kv: kv[1].rank)
            k = rec.params.get("top_k", 5)
            return {
                **_id_fields(rec),
                "task": "next_token",
                "next_tokens": [
                    {"token": self.tok.decode([i]), "id": i, "prob": math.exp(lp.logprob)}
                    for i, lp in top[:k]
                ],
                **usage(job, 1),
            }
        gens = [self._generation(c, rec.params.get("logprobs")) for c in out.outputs]
        res = {**_id_fields(rec), "task": rec.task, **gens[0]}
        if len(gens) > 1:
            res["generations"] = gens
        return {**res, **usage(job, sum(len(c.token_ids) for c in out.outputs))}

    def _generation(self, c, top: int | None = None) -> dict:
        ids = list(c.token_ids)
        # flat log-probs, one per position (the sampled token's first at each start, then top-k)
        flat = c.logprobs
        steps = flat.start_indices[: len(ids)] if flat is not None else []
        logprobs = [flat.logprobs[i] for i in steps]
        if c.finish_reason == "stop" and c.stop_reason is None and ids and ids[-1] == self.eos:
            finish, ids, logprobs = "eos", ids[:-1], logprobs[: len(ids) - 1]
        else:
            finish = "stop" if c.finish_reason == "stop" else "length"
        out = {
            "generated_text": c.text,
            "tokens": len(ids),
            "finish_reason": finish,
            "mean_logprob": sum(logprobs) / len(logprobs) if logprobs else None,
        }
        if top is not None:
            out["logprobs"] = [self._position(flat, p) for p in range(len(ids))]
        return out

    def _position(self, flat, p: int) -> dict:
        """One generated token's log-prob and, ranked, the `top` most likely at its place."""
        s, e = flat.start_indices[p], flat.end_indices[p]

        def one(i: int) -> dict:
            tid = flat.token_ids[i]
            return {"token": self.tok.decode([tid]), "id": tid, "logprob": flat.logprobs[i]}

        ranked = sorted(range(s + 1, e), key=lambda i: flat.ranks[i])
        return {**one(s), "top": [one(i) for i in ranked]}


def score_result(job: Job, s, tok) -> dict:
    """A score line (either engine): totals, and per token when the record asks."""
    res = {
        **_id_fields(job.record),
        "task": "score",
        "logprob": s.logprob,
        "mean_logprob": s.mean_logprob,
        "perplexity": s.perplexity,
        "tokens": s.tokens,
    }
    if job.record.params.get("per_token"):
        res["token_logprobs"] = s.token_logprobs
        res["token_strs"] = [tok.decode([t]) for t in job.ids[1:]]
    return {**res, **usage(job)}


# vLLM sizes its LoRA slots to one of these ranks (LoRAConfig.max_lora_rank)
LORA_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# adapters applied in one engine step (vLLM's max_loras; more wait in its CPU cache): each slot
# holds max_lora_rank-sized weights for every adapted layer
MAX_LORAS = int(os.environ.get("SLUICE_MAX_LORAS", "8"))


@dataclass
class Adapter:
    """A LoRA adapter vLLM applies: the unmerged one (lora_merge=false) to every record, or a
    named one (`adapters/<name>/`) to the records that ask for it."""

    path: Path
    rank: int

    @property
    def slot(self) -> int:
        return next(s for s in LORA_SLOTS if s >= self.rank)


def vllm_adapter(model_dir: Path, adapter: Path) -> Adapter | None:
    """The adapter for vLLM to apply, or None when it cannot: vLLM's LoRA covers most decoder
    architectures (Llama, Qwen2, Mistral, ...) but not all (GPT-2), and ranks up to 512."""
    import json

    from transformers import AutoConfig
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_lora

    rank = int(json.loads((adapter / "adapter_config.json").read_text()).get("r", 0))
    archs = AutoConfig.from_pretrained(model_dir).architectures or []
    try:
        classes = [ModelRegistry._try_load_model_cls(a) for a in archs]  # vLLM has no public check
    except Exception as e:  # an architecture vLLM cannot import is served merged
        log.warning("vLLM's model class for %s did not load (%s)", archs, e)
        classes = []
    if not any(c is not None and supports_lora(c) for c in classes) or not 0 < rank <= 512:
        return None
    return Adapter(adapter, rank)


def check_runnable(model_dir, cuda: bool) -> None:
    """Refuse at start a model whose attention vLLM's CPU kernels cannot run: vLLM itself
    starts, answers /ping, then fails every record. Its own list of head sizes decides."""
    if cuda:
        return
    from transformers import AutoConfig
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    cfg = AutoConfig.from_pretrained(model_dir)
    hidden = int(getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", 0) or 0)
    size = getattr(cfg, "head_dim", None) or hidden // _heads(cfg)
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if size and size not in sizes:
        raise SluiceError(
            f"{model_dir}: its attention heads are {size}-dimensional, and vLLM's CPU attention "
            f"runs heads of {', '.join(map(str, sizes))} dimensions only: serve it on a GPU "
            "instance, or train it with fewer, wider heads"
        )


def _heads(cfg) -> int:
    """A config's attention heads (the name varies by architecture)."""
    return int(getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", 1))
