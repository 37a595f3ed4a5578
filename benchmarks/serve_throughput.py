"""Serving throughput: Sluice's serve process vs the paths a user would otherwise take.

Side by side in one run, same model (GPT-2 architecture, random weights), same prompts:
- baseline: `transformers.pipeline("text-generation")` once per record; one forward per record
  for scoring;
- plain batching: prompts sorted by length, `model.generate` on batches of 32 with left padding;
  one batched forward per 64 records for scoring;
- the previous engine: Sluice's hand-written static-batch generation loop before vLLM (commit
  LEGACY_REV, read from git history, run in-process: no HTTP);
- vLLM offline: `vllm.LLM.generate` on the same model and prompts in this process, the ceiling
  `sluice serve` (vLLM underneath, plus HTTP, JSON and tokenising) is measured against; for
  scoring, vLLM's prompt log-probs (what `SLUICE_SCORE_ENGINE=vllm` runs);
- Sluice: the real `sluice serve` over HTTP with MultiRecord JSON Lines payloads, as many
  requests in flight as its /execution-parameters asks for.

Greedy generation (32 new tokens, prompts of mixed lengths) and scoring, records/s and tokens/s,
ratios, and whether the outputs are identical across the three. Score efficiency is
2 x parameters x tokens / time against a plain fp32 matmul measured in the same run.

    python -m benchmarks.serve_throughput [--gen-records 96] [--score-records 1024] [--size base]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

SIZES = {  # with the 8192-token vocabulary: ~14M and ~92M parameters
    "small": {"n_layer": 6, "n_head": 6, "n_embd": 384, "n_positions": 512},
    "base": {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 512},
}
VOCAB = 8192
NEW_TOKENS = 32


def corpus_lines(limit: int = 40000) -> list[str]:
    """Real text from the Python standard library's sources: there on every machine."""
    lines: list[str] = []
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        for line in f.read_text(errors="ignore").splitlines():
            line = line.strip()
            if len(line) > 20:
                lines.append(line)
        if len(lines) >= limit:
            break
    return lines


def build_model(workdir: Path, size: str = "small") -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    from sluice.tokenizer import train_bpe

    tok = train_bpe(corpus_lines(), VOCAB)
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=len(tok),
        **SIZES[size],
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = GPT2LMHeadModel(cfg)
    out = workdir / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def prompts(tok, n: int, seed: int, lo: int, hi: int) -> list[str]:
    """n prompts of mixed token lengths (lo..hi), cut from real lines."""
    rng = random.Random(seed)
    lines = corpus_lines()
    out = []
    while len(out) < n:
        ids = tok(rng.choice(lines) + " " + rng.choice(lines))["input_ids"]
        k = rng.randint(lo, hi)
        if len(ids) >= k:
            out.append(tok.decode(ids[:k]))
    return out


def matmul_flops() -> float:
    """fp32 matmul rate on this machine now: the median of 5 timed runs of 10 products."""
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    rates = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        rates.append(2 * n**3 * 10 / (time.perf_counter() - t0))
    return statistics.median(rates)


# --- the three paths -----------------------------------------------------------------------------


def baseline_generate(model, tok, texts):
    from transformers import pipeline

    pipe = pipeline("text-generation", model=model, tokenizer=tok, device=model.device)
    out = []
    for t in texts:
        r = pipe(
            t,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            return_full_text=False,
            pad_token_id=tok.pad_token_id,
        )
        out.append(r[0]["generated_text"])
    return out


def plain_generate(model, tok, texts, batch=32):
    tok.padding_side = "left"
    order = sorted(range(len(texts)), key=lambda i: len(tok(texts[i])["input_ids"]))
    out = [None] * len(texts)
    with torch.inference_mode():
        for s in range(0, len(order), batch):
            idx = order[s : s + batch]
            enc = tok([texts[i] for i in idx], return_tensors="pt", padding=True)
            gen = model.generate(
                **enc, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=tok.pad_token_id
            )
            for i, row in zip(idx, gen[:, enc["input_ids"].shape[1] :], strict=True):
                out[i] = tok.decode(row, skip_special_tokens=True)
    tok.padding_side = "right"
    return out


LEGACY_REV = "0260b2b"


def legacy_engine(model, tok):
    """The pre-vLLM engine from git history (its relative imports pointed at today's package)."""
    import subprocess
    import types

    src = subprocess.run(
        ["git", "show", f"{LEGACY_REV}:container/sluice/engine.py"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent,
    ).stdout
    mod = sys.modules["sluice_legacy_engine"] = types.ModuleType("sluice_legacy_engine")
    exec(compile(src.replace("from .", "from sluice."), "legacy_engine.py", "exec"), mod.__dict__)
    return mod.Engine(model, tok, mod.EngineConfig())


def legacy_generate(engine, texts):
    from sluice.records import Record

    records = [
        Record(i, t, "generate", {"max_new_tokens": NEW_TOKENS}) for i, t in enumerate(texts)
    ]
    jobs = engine.prepare(records)
    engine.run(jobs)
    return [j.result["generated_text"] for j in jobs]


def start_vllm(model_dir: Path):
    from vllm import LLM

    from sluice.engine import cpu_defaults

    cpu_defaults()
    return LLM(
        model=str(model_dir),
        dtype="float32",
        seed=0,
        enforce_eager=True,
        gpu_memory_utilization=0.15,
        disable_log_stats=True,
    )


def vllm_generate(llm, texts, logprobs: bool = False):
    """Greedy; with logprobs, each generated token's log-prob as well (what Sluice asks for,
    for `mean_logprob`), in vLLM's flat form."""
    from vllm import SamplingParams

    extra = {"logprobs": 0, "flat_logprobs": True} if logprobs else {}
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, **extra)
    outs = llm.generate(texts, params, use_tqdm=False)
    return [o.outputs[0].text for o in outs]


def vllm_score(llm, seqs):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    outs = llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
    return [
        sum(o.prompt_logprobs[i][s[i]].logprob for i in range(1, len(s)))
        for o, s in zip(outs, seqs, strict=True)
    ]


def plain_next_token(model, tok, seqs, k=5, batch=64):
    """Top-k next tokens from batched left-padded forwards (what `serve` did before vLLM)."""
    out = []
    with torch.inference_mode():
        for s in range(0, len(seqs), batch):
            chunk = seqs[s : s + batch]
            longest = max(map(len, chunk))
            x = torch.tensor([[tok.pad_token_id] * (longest - len(q)) + q for q in chunk])
            m = torch.tensor([[0] * (longest - len(q)) + [1] * len(q) for q in chunk])
            pos = (m.cumsum(-1) - 1).clamp(min=0)
            logits = model(input_ids=x, attention_mask=m, position_ids=pos).logits[:, -1]
            out += torch.topk(logits.float().softmax(-1), k).indices.tolist()
    return out


def vllm_next_token(llm, seqs, k=5):
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0, logprobs=k)
    outs = llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
    return [
        [i for i, _ in sorted(o.outputs[0].logprobs[0].items(), key=lambda kv: kv[1].rank)][:k]
        for o in outs
    ]


def score_one(model, ids: list[int]) -> float:
    x = torch.tensor([ids])
    logp = model(input_ids=x).logits[0, :-1].log_softmax(-1)
    return logp.gather(-1, x[0, 1:, None]).sum().item()


def baseline_score(model, seqs):
    with torch.inference_mode():
        return [score_one(model, s) for s in seqs]


def plain_score(model, seqs, pad, batch=64):
    out = []
    with torch.inference_mode():
        for s in range(0, len(seqs), batch):
            chunk = seqs[s : s + batch]
            longest = max(map(len, chunk))
            x = torch.full((len(chunk), longest), pad)
            m = torch.zeros_like(x)
            for r, q in enumerate(chunk):
                x[r, : len(q)] = torch.tensor(q)
                m[r, : len(q)] = 1
            logp = model(input_ids=x, attention_mask=m).logits[:, :-1].log_softmax(-1)
            lp = (logp.gather(-1, x[:, 1:, None])[..., 0] * m[:, 1:]).sum(1)
            out += lp.tolist()
    return out


def sluice_run(server, records: list[dict], payload_records: int, concurrency: int):
    from sluice_local.transform import TransformConfig

    cfg = TransformConfig()
    bodies = [
        "\n".join(json.dumps(r) for r in records[s : s + payload_records]).encode()
        for s in range(0, len(records), payload_records)
    ]
    with ThreadPoolExecutor(concurrency) as pool:
        responses = list(pool.map(lambda b: server.invoke(b, cfg), bodies))
    return [json.loads(line) for r in responses for line in r.decode().split("\n")]


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gen-records", type=int, default=96)
    ap.add_argument("--score-records", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", choices=list(SIZES), default="small")
    ap.add_argument("--no-baseline", action="store_true", help="skip the per-record baselines")
    ap.add_argument("--out", default="benchmarks/results/serve_throughput.json")
    args = ap.parse_args()

    from sluice.model import load_model, parameter_count
    from sluice.scoring import encode_for_scoring
    from sluice_local.transform import ServeProcess

    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    model_dir = build_model(work, args.size)
    model, tok = load_model(model_dir)
    model.eval()
    params = parameter_count(model)
    gen_texts = prompts(tok, args.gen_records, seed=1, lo=4, hi=48)
    score_texts = prompts(tok, args.score_records, seed=2, lo=8, hi=64)
    seqs = encode_for_scoring(tok, score_texts)
    score_tokens = sum(len(s) for s in seqs)
    gen_tokens = args.gen_records * NEW_TOKENS
    print(
        f"model: GPT-2 {params / 1e6:.1f}M parameters, vocab {len(tok)}, "
        f"{torch.get_num_threads()} threads",
        file=sys.stderr,
    )
    res: dict = {"parameters": params, "threads": torch.get_num_threads()}
    # the slow per-record baselines once; the batched paths interleaved, medians of `repeats`
    if args.no_baseline:
        base_gen, t_base_gen, base_sc, t_base_sc = None, float("nan"), None, float("nan")
    else:
        base_gen, t_base_gen = timed(baseline_generate, model, tok, gen_texts)
        base_sc, t_base_sc = timed(baseline_score, model, seqs)
    llm = start_vllm(model_dir)
    legacy = legacy_engine(model, tok)

    server = ServeProcess(model_dir, {"SAGEMAKER_BATCH": "true"})
    runs: dict[str, list[float]] = {
        "plain_gen": [],
        "sluice_gen": [],
        "vllm_gen": [],
        "vllm_lp_gen": [],
        "legacy_gen": [],
        "plain_sc": [],
        "plain_nt": [],
        "vllm_nt": [],
        "sluice_nt": [],
        "sluice_sc": [],
        "vllm_sc": [],
        "matmul": [],
    }
    try:
        t0 = time.perf_counter()
        server.wait_ready()
        res["sluice_start_s"] = time.perf_counter() - t0
        ep = server.execution_parameters()
        conc = ep["MaxConcurrentTransforms"]
        gen_recs = [
            {"id": i, "text": t, "parameters": {"max_new_tokens": NEW_TOKENS}}
            for i, t in enumerate(gen_texts)
        ]
        sc_recs = [{"id": i, "text": t, "task": "score"} for i, t in enumerate(score_texts)]
        nt_recs = [{"id": i, "text": t, "task": "next_token"} for i, t in enumerate(score_texts)]
        nt_seqs = [s[1:] for s in seqs]  # the texts' own tokens, no BOS
        sluice_run(server, gen_recs[:8], 8, 1)  # warm-up: first-call allocations
        for _ in range(args.repeats):
            plain_gen, t = timed(plain_generate, model, tok, gen_texts)
            runs["plain_gen"].append(t)
            out_gen, t = timed(sluice_run, server, gen_recs, max(1, len(gen_recs) // conc), conc)
            runs["sluice_gen"].append(t)
            vllm_gen, t = timed(vllm_generate, llm, gen_texts)
            runs["vllm_gen"].append(t)
            _, t = timed(vllm_generate, llm, gen_texts, True)
            runs["vllm_lp_gen"].append(t)
            legacy_gen, t = timed(legacy_generate, legacy, gen_texts)
            runs["legacy_gen"].append(t)
            vllm_sc, t = timed(vllm_score, llm, seqs)
            runs["vllm_sc"].append(t)
            plain_nt, t = timed(plain_next_token, model, tok, nt_seqs)
            runs["plain_nt"].append(t)
            vllm_nt, t = timed(vllm_next_token, llm, nt_seqs)
            runs["vllm_nt"].append(t)
            out_nt, t = timed(sluice_run, server, nt_recs, max(1, len(nt_recs) // conc), conc)
            runs["sluice_nt"].append(t)
            plain_sc, t = timed(plain_score, model, seqs, tok.pad_token_id)
            runs["plain_sc"].append(t)
            out_sc, t = timed(sluice_run, server, sc_recs, max(1, len(sc_recs) // conc), conc)
            runs["sluice_sc"].append(t)
            runs["matmul"].append(matmul_flops())
    finally:
        server.stop()
    med = {k: statistics.median(v) for k, v in runs.items()}
    t_plain_gen, t_sl_gen, t_plain_sc, t_sl_sc = (
        med["plain_gen"],
        med["sluice_gen"],
        med["plain_sc"],
        med["sluice_sc"],
    )
    flops = med["matmul"]
    res["matmul_flops"] = flops
    res["runs_s"] = runs
    sl_gen = [o["generated_text"] for o in out_gen]
    sl_sc = [o["logprob"] for o in out_sc]

    def same_text(a, b):
        if a is None or b is None:
            return float("nan")
        return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)

    def close(a, b):
        if a is None or b is None:
            return float("nan")
        return max(abs(x - y) for x, y in zip(a, b, strict=True))

    gen = {
        "baseline_pipeline_s": t_base_gen,
        "plain_batching_s": t_plain_gen,
        "sluice_s": t_sl_gen,
        "vllm_offline_s": med["vllm_gen"],
        "vllm_offline_logprobs_s": med["vllm_lp_gen"],
        "identical_sluice_vs_vllm": same_text(sl_gen, vllm_gen),
        "previous_engine_s": med["legacy_gen"],
        "identical_sluice_vs_previous": same_text(sl_gen, legacy_gen),
        "records": args.gen_records,
        "new_tokens": gen_tokens,
        "identical_sluice_vs_pipeline": same_text(sl_gen, base_gen),
        "identical_sluice_vs_plain": same_text(sl_gen, plain_gen),
        "identical_plain_vs_pipeline": same_text(plain_gen, base_gen),
    }
    sc = {
        "baseline_per_record_s": t_base_sc,
        "plain_batching_s": t_plain_sc,
        "sluice_s": t_sl_sc,
        "vllm_offline_s": med["vllm_sc"],
        "max_abs_logprob_diff_vllm_vs_plain": close(vllm_sc, plain_sc),
        "records": args.score_records,
        "tokens": score_tokens,
        "max_abs_logprob_diff_sluice_vs_baseline": close(sl_sc, base_sc),
        "max_abs_logprob_diff_plain_vs_baseline": close(plain_sc, base_sc),
        "sluice_flops": 2 * params * score_tokens / t_sl_sc,
    }
    sl_nt = [[t["id"] for t in o["next_tokens"]] for o in out_nt]
    nt = {
        "plain_batching_s": med["plain_nt"],
        "vllm_offline_s": med["vllm_nt"],
        "sluice_s": med["sluice_nt"],
        "records": args.score_records,
        "same_top1_sluice_vs_plain": sum(a[0] == b[0] for a, b in zip(sl_nt, plain_nt, strict=True))
        / len(sl_nt),
        "same_top1_vllm_vs_plain": sum(a[0] == b[0] for a, b in zip(vllm_nt, plain_nt, strict=True))
        / len(vllm_nt),
    }
    res.update(generate=gen, score=sc, next_token=nt, execution_parameters=ep)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")

    print(
        f"\nGPT-2 {params / 1e6:.1f}M params, {torch.get_num_threads()} threads, "
        f"fp32 matmul {flops / 1e9:.0f} GFLOP/s"
    )
    print(f"{'generate (greedy, 32 new)':28}{'records/s':>11}{'tokens/s':>10}{'vs pipeline':>13}")
    for name, t in (
        ("pipeline, per record", t_base_gen),
        ("plain batching (32)", t_plain_gen),
        ("previous engine", med["legacy_gen"]),
        ("vLLM offline (ceiling)", med["vllm_gen"]),
        ("vLLM offline + logprobs", med["vllm_lp_gen"]),
        ("Sluice serve (HTTP)", t_sl_gen),
    ):
        print(
            f"{name:28}{args.gen_records / t:>11.2f}{gen_tokens / t:>10.0f}{t_base_gen / t:>12.1f}x"
        )
    print(
        f"Sluice vs plain batching: {t_plain_gen / t_sl_gen:.2f}x; identical outputs: "
        f"Sluice=pipeline {gen['identical_sluice_vs_pipeline']:.0%}, "
        f"Sluice=plain {gen['identical_sluice_vs_plain']:.0%}, "
        f"Sluice=vLLM {gen['identical_sluice_vs_vllm']:.0%}, "
        f"Sluice=previous {gen['identical_sluice_vs_previous']:.0%}, "
        f"plain=pipeline {gen['identical_plain_vs_pipeline']:.0%}"
    )
    print(
        f"Sluice serve vs vLLM offline: {med['vllm_gen'] / t_sl_gen:.2f}x "
        f"(vs the same request, per-token log-probs: {med['vllm_lp_gen'] / t_sl_gen:.2f}x); "
        f"vs the previous engine: {med['legacy_gen'] / t_sl_gen:.2f}x; "
        f"start-up to /ping: {res['sluice_start_s']:.0f} s"
    )
    print(f"{'score':28}{'records/s':>11}{'tokens/s':>10}{'vs per-record':>15}{'GFLOP/s':>9}")
    for name, t in (
        ("forward per record", t_base_sc),
        ("plain batching (64)", t_plain_sc),
        ("vLLM prompt_logprobs", med["vllm_sc"]),
        ("Sluice serve (HTTP)", t_sl_sc),
    ):
        print(
            f"{name:28}{args.score_records / t:>11.1f}{score_tokens / t:>10.0f}"
            f"{t_base_sc / t:>14.1f}x{2 * params * score_tokens / t / 1e9:>9.1f}"
        )
    print(
        f"Sluice score: {sc['sluice_flops'] / flops:.0%} of matmul FLOP/s; max |logprob diff| "
        f"vs per-record {sc['max_abs_logprob_diff_sluice_vs_baseline']:.2e}"
    )
    print(f"{'next_token (top 5)':28}{'records/s':>11}")
    for name, key in (
        ("plain batching (64)", "plain_nt"),
        ("vLLM offline (logprobs=5)", "vllm_nt"),
        ("Sluice serve (HTTP, vLLM)", "sluice_nt"),
    ):
        print(f"{name:28}{args.score_records / med[key]:>11.1f}")
    print(f"same top token, Sluice vs plain: {nt['same_top1_sluice_vs_plain']:.0%}")


if __name__ == "__main__":
    main()
