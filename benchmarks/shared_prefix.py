"""Records that share a long instruction prefix: Sluice against vLLM's offline defaults.

The records of one batch file usually start with the same system prompt or few-shot block. vLLM
caches KV blocks by prefix (automatic prefix caching, on by default for generative models, on
CPUs too), and `sluice serve` keeps it on. Side by side, in alternating rounds, on the same model
(GPT-2 architecture, ~14M, random weights, float32) and records (a 300-token prefix + 4-48 tokens
of their own, greedy 32 new tokens):

- Sluice: the real `sluice serve`, one MultiRecord request as Batch Transform sends it, on its
  default dtype (`auto`: the checkpoint's float32), with glibc's allocator instead of tcmalloc
  (`SLUICE_MALLOC=system`; tcmalloc is used where installed) and in bfloat16
  (`SLUICE_DTYPE=bfloat16`);
- vLLM's offline `LLM` with its defaults (prefix caching on; its `auto` dtype casts a float32
  checkpoint down to bfloat16 on a CPU with native bf16), and in float32, in this process;
- vLLM's defaults without prefix caching, to show what the cache is worth.

    python -m benchmarks.shared_prefix [--records 1536] [--prefix 300] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.engine_processes import post
from benchmarks.serve_throughput import NEW_TOKENS, build_model, corpus_lines, prompts


def main() -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from sluice.engine import cpu_defaults
    from sluice_local.transform import ServeProcess

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1536)
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp))
        tok = AutoTokenizer.from_pretrained(model)
        head = tok.decode(tok(" ".join(corpus_lines()[:80]))["input_ids"][: args.prefix])
        texts = [head + " " + t for t in prompts(tok, args.records, 2, 4, 48)]
        body = "\n".join(
            json.dumps({"text": t, "parameters": {"max_new_tokens": NEW_TOKENS}}) for t in texts
        ).encode()
        cpu_defaults()
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0)
        offline = {
            "vLLM offline defaults (prefix caching on)": {},
            "vLLM offline, float32": {"dtype": "float32"},
            "vLLM offline, prefix caching off": {"enable_prefix_caching": False},
        }
        ours = {
            "sluice (auto: float32)": {},
            "sluice, glibc malloc": {"SLUICE_MALLOC": "system"},
            "sluice bfloat16": {"SLUICE_DTYPE": "bfloat16"},
        }
        llms = {  # both kept for the whole run: an idle engine waits without using the CPU
            mode: LLM(
                model=str(model),
                seed=0,
                enforce_eager=True,
                gpu_memory_utilization=0.15,
                disable_log_stats=True,
                **kwargs,
            )
            for mode, kwargs in offline.items()
        }
        res: dict[str, list[float]] = {m: [] for m in [*ours, *offline]}
        texts_out: dict[str, list[str]] = {}
        for _ in range(args.rounds):
            for mode, env in ours.items():
                server = ServeProcess(model, {"SAGEMAKER_BATCH": "true", **env})
                server.wait_ready(600)
                post(server.url, body[: body.index(b"\n")])  # first request
                took, lines = post(server.url, body)
                res[mode].append(took)
                texts_out[mode] = [json.loads(x)["generated_text"] for x in lines]
                server.stop()
            for mode, llm in llms.items():
                t = time.perf_counter()
                outs = llm.generate(texts, params, use_tqdm=False)
                res[mode].append(time.perf_counter() - t)
                texts_out[mode] = [o.outputs[0].text for o in outs]
    med = {m: statistics.median(v) for m, v in res.items()}
    for mode, took in med.items():
        print(f"{mode:44s} {took:7.2f} s  ({args.records / took:6.1f} records/s)")
    for a, b in [
        ("sluice (auto: float32)", "vLLM offline, float32"),
        ("sluice, glibc malloc", "vLLM offline, float32"),
        ("sluice (auto: float32)", "sluice, glibc malloc"),
        ("sluice bfloat16", "vLLM offline defaults (prefix caching on)"),
        ("sluice (auto: float32)", "vLLM offline defaults (prefix caching on)"),
    ]:
        same = sum(x == y for x, y in zip(texts_out[a], texts_out[b], strict=True))
        print(f"{a} vs {b}: {med[b] / med[a]:.2f}x, identical texts {same}/{args.records}")


if __name__ == "__main__":
    main()
