"""Four LoRA adapters served together (records interleaved) vs one model with its adapter merged.

The cost of choosing the adapter per record: the same prompts, greedy, 32 new tokens, through two
`sluice serve` processes alive side by side and called as Batch Transform calls them (MultiRecord
JSON Lines, as many requests in flight as /execution-parameters says), in alternating rounds:
  - multi: a Llama base with four rank-16 adapters (q/k/v/o) under adapters/, record i naming
    adapter i % 4 (so every batch mixes all four);
  - merged: the same base with the first adapter merged into its weights, records naming none.
Reported: generated tokens per second (the adapters change how long answers are), the ratio
multi / merged, and each server's resident memory (serve and its engine processes).

    python -m benchmarks.multi_lora [--records 256] [--repeats 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks.serve_throughput import NEW_TOKENS, VOCAB, corpus_lines, prompts, sluice_run, timed

NAMES = ["a0", "a1", "a2", "a3"]


def build(work: Path) -> tuple[Path, Path]:
    """(base with four adapters, the base with a0 merged): a ~14M Llama, 64-dim heads."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from sluice.tokenizer import train_bpe

    tok = train_bpe(corpus_lines(), VOCAB)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=6,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    base = work / "multi"
    LlamaForCausalLM(cfg).save_pretrained(base)
    tok.save_pretrained(base)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    for i, name in enumerate(NAMES):
        torch.manual_seed(1 + i)
        lora = LoraConfig(r=16, lora_alpha=16, target_modules=targets, init_lora_weights=False)
        get_peft_model(LlamaForCausalLM.from_pretrained(base), lora).save_pretrained(
            base / "adapters" / name
        )
    merged = work / "merged"
    model = PeftModel.from_pretrained(
        LlamaForCausalLM.from_pretrained(base), base / "adapters" / NAMES[0]
    )
    model.merge_and_unload().save_pretrained(merged)
    tok.save_pretrained(merged)
    return base, merged


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (serve, vLLM's engine and worker)."""
    import psutil

    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from sluice_local.transform import ServeProcess

    multi_dir, merged_dir = build(Path(tempfile.mkdtemp(prefix="bench-lora-")))
    texts = prompts(AutoTokenizer.from_pretrained(merged_dir), args.records, seed=1, lo=4, hi=48)
    params = {"max_new_tokens": NEW_TOKENS}
    work = {
        "multi": [
            {"id": str(i), "text": t, "adapter": NAMES[i % 4], "parameters": params}
            for i, t in enumerate(texts)
        ],
        "merged": [{"id": str(i), "text": t, "parameters": params} for i, t in enumerate(texts)],
    }
    servers = {
        "multi": ServeProcess(multi_dir, {"SAGEMAKER_BATCH": "true"}),
        "merged": ServeProcess(merged_dir, {"SAGEMAKER_BATCH": "true"}),
    }
    rate: dict[str, list[float]] = {"multi": [], "merged": []}
    try:
        for s in servers.values():
            s.wait_ready()
        conc = servers["merged"].execution_parameters()["MaxConcurrentTransforms"]
        per = max(1, len(texts) // conc)
        for name, s in servers.items():
            sluice_run(s, work[name][:8], 8, 1)  # warm-up
        for r in range(args.repeats):  # alternate which goes first: no order advantage
            for name in ("multi", "merged") if r % 2 == 0 else ("merged", "multi"):
                out, t = timed(sluice_run, servers[name], work[name], per, conc)
                assert not any("error" in o for o in out), [o for o in out if "error" in o][:2]
                rate[name].append(sum(o["tokens"] for o in out) / t)
        rss = {name: tree_rss_mb(s.proc.pid) for name, s in servers.items()}
    finally:
        for s in servers.values():
            s.stop()
    med = {k: statistics.median(v) for k, v in rate.items()}
    res = {
        "records": args.records,
        "new_tokens": NEW_TOKENS,
        "adapters": len(NAMES),
        "rank": 16,
        "multi_tokens_per_s": med["multi"],
        "merged_tokens_per_s": med["merged"],
        "multi_vs_merged": med["multi"] / med["merged"],
        "rss_mb": rss,
        "runs_tokens_per_s": rate,
    }
    print(json.dumps(res, indent=2))
    print(
        f"4 adapters interleaved at {res['multi_vs_merged']:.3f}x one merged model's throughput "
        f"({args.records} records, medians of {args.repeats}); RSS {rss['multi']:.0f} MB vs "
        f"{rss['merged']:.0f} MB",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
