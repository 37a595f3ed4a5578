"""The checkpoint's dtype: a bfloat16 checkpoint served as saved vs upcast to float32.

Most published LLMs are saved in bfloat16. Before `SLUICE_DTYPE=auto` followed the checkpoint,
`sluice serve` ran every model in float32 on CPUs. Side by side, in alternating rounds on the same
model (GPT-2 architecture, ~14M, briefly trained so that its distributions are not flat) saved in
bfloat16 (or, with --saved float16, in float16), and the same prompts, called as Batch Transform
calls it (one MultiRecord request):

- Sluice with `SLUICE_DTYPE=float32` (what it did before),
- Sluice on its default (`auto`: bfloat16 on a CPU with AMX / AVX512-BF16),
- vLLM's offline `LLM` on its own default dtype (`auto`), in this process,

greedy generation (32 new tokens) and scoring, medians; and what bfloat16 changes in the answers:
greedy texts identical to float32's, and the score difference per token.

    python -m benchmarks.serve_dtype [--records 384] [--rounds 2] [--train-steps 300]
                                     [--saved bfloat16|float16]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.engine_processes import post
from benchmarks.serve_throughput import (
    NEW_TOKENS,
    build_model,
    corpus_lines,
    prompts,
    vllm_generate,
    vllm_score,
)

MODES = {"sluice float32 (before)": {"SLUICE_DTYPE": "float32"}, "sluice auto": {}}


def train_briefly(model_dir: Path, steps: int, out: Path, saved: str = "bfloat16") -> Path:
    """`steps` of AdamW on real text, then saved in `saved` (bfloat16, as most published models
    are; float16 for the older ones)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lines = corpus_lines()
    torch.manual_seed(0)
    model.train()
    for step in range(steps):
        batch = [lines[(step * 16 + i) % len(lines)] for i in range(16)]
        enc = tok(batch, return_tensors="pt", padding=True, truncation=True, max_length=64)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    print(f"trained {steps} steps, last loss {loss.item():.2f}")
    model.to(getattr(torch, saved)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main() -> None:
    from transformers import AutoTokenizer
    from vllm import LLM

    from sluice.engine import cpu_defaults
    from sluice_local.transform import ServeProcess

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=384)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--saved", choices=["bfloat16", "float16"], default="bfloat16")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp))
        model = train_briefly(model, args.train_steps, Path(tmp) / args.saved, args.saved)
        tok = AutoTokenizer.from_pretrained(model)
        texts = prompts(tok, args.records, 1, 4, 48)
        gen = [{"text": t, "parameters": {"max_new_tokens": NEW_TOKENS}} for t in texts]
        gen_body = "\n".join(map(json.dumps, gen)).encode()
        score_body = "\n".join(json.dumps({"text": t, "task": "score"}) for t in texts).encode()
        seqs = [tok(t)["input_ids"] for t in texts]
        cpu_defaults()
        llm = LLM(model=str(model), seed=0, enforce_eager=True, gpu_memory_utilization=0.15)
        vllm_dtype = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
        vllm_name = f"vLLM offline default ({vllm_dtype})"
        res = {m: {"generate": [], "score": []} for m in [*MODES, vllm_name]}
        outs: dict[str, list[dict]] = {}
        scores: dict[str, list[dict]] = {}
        for _ in range(args.rounds):
            for mode, env in MODES.items():
                server = ServeProcess(model, {"SAGEMAKER_BATCH": "true", **env})
                server.wait_ready(600)
                post(server.url, "\n".join(map(json.dumps, gen[:8])).encode())  # first request
                took, lines = post(server.url, gen_body)
                res[mode]["generate"].append(took)
                outs[mode] = [json.loads(x) for x in lines]
                took, lines = post(server.url, score_body)
                res[mode]["score"].append(took)
                scores[mode] = [json.loads(x) for x in lines]
                server.stop()
            t = time.perf_counter()
            vllm_texts = vllm_generate(llm, texts, logprobs=True)
            res[vllm_name]["generate"].append(time.perf_counter() - t)
            t = time.perf_counter()
            vllm_score(llm, seqs)
            res[vllm_name]["score"].append(time.perf_counter() - t)
    med = {m: {k: statistics.median(v) for k, v in r.items()} for m, r in res.items()}
    for mode, figures in med.items():
        print(f"{mode:34s}", "  ".join(f"{k} {v:6.2f} s" for k, v in figures.items()))
    before, auto, vllm = (med[m] for m in res)
    print(
        f"auto vs float32: generation {before['generate'] / auto['generate']:.2f}x, "
        f"scoring {before['score'] / auto['score']:.2f}x; "
        f"auto vs vLLM offline default: generation {vllm['generate'] / auto['generate']:.2f}x, "
        f"scoring {vllm['score'] / auto['score']:.2f}x"
    )
    a, b = (outs[m] for m in MODES)
    same = sum(x["generated_text"] == y["generated_text"] for x, y in zip(a, b, strict=True))
    same_vllm = sum(y["generated_text"] == v for y, v in zip(b, vllm_texts, strict=True))
    print(f"greedy texts identical, auto vs float32: {same}/{len(a)}; auto vs vLLM: {same_vllm}")
    deltas = [
        abs(x["mean_logprob"] - y["mean_logprob"])
        for x, y in zip(*(scores[m] for m in MODES), strict=True)
    ]
    print(
        "score |mean_logprob(auto) - mean_logprob(float32)|: "
        f"median {statistics.median(deltas):.4f}"
        f", max {max(deltas):.4f} nats per token"
    )


if __name__ == "__main__":
    main()
