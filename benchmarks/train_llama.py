"""Fine-tuning a Llama-architecture model: Sluice vs Hugging Face `Trainer` (and `peft` +
`Trainer` for LoRA), tokens/s and peak memory, plus `sluice-local plan`'s estimate against the
measured peak.

Every run is its own process (peak RSS is per process), runs alternate (Sluice full, Trainer full,
Sluice LoRA, peft + Trainer, then again), medians reported. Same pretrained folder (random
weights), same tokenizer, same batch, optimizer settings and LoRA settings. Tokens/s leave out the
first `warmup` steps. Memory: the peak RSS minus the RSS once torch, transformers and peft are
imported, compared with the plan for the same settings on this device (float32, one process).

    python -m benchmarks.train_llama [--steps 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MODEL = {
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 512,
}
VOCAB, BATCH, BLOCK, LR, WARMUP_LR = 4096, 8, 256, 3e-4, 5
LORA = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.05}


def rss_now() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def imports() -> None:
    """What either tool imports, loaded before the baseline RSS in both (same baseline)."""
    import peft  # noqa: F401
    import transformers.trainer  # noqa: F401

    import sluice.train  # noqa: F401


def child_sluice(root: Path, model: Path, data: Path, method: str, steps: int, warmup: int,
                 checkpointing: bool) -> dict:  # fmt: skip
    import contextlib
    import io

    imports()
    from sluice.hyperparameters import parse_hyperparameters
    from sluice.paths import OptML
    from sluice.train import run_training

    base = rss_now()
    os.environ.update(
        SLUICE_OPT_ML=str(root), SM_CHANNEL_TRAIN=str(data), SM_CHANNEL_PRETRAINED=str(model)
    )
    cfg = parse_hyperparameters(
        {
            "finetune_method": method,
            "lora_r": str(LORA["r"]),
            "lora_alpha": str(LORA["lora_alpha"]),
            "lora_dropout": str(LORA["lora_dropout"]),
            "block_size": str(BLOCK),
            "batch_size": str(BATCH),
            "learning_rate": str(LR),
            "warmup_steps": str(WARMUP_LR),
            "max_steps": str(steps),
            "log_interval": str(warmup),
            "checkpoint_interval": "0",
            "export_edge": "false",
            "loss_curve": "false",
            "eval_max_records": "20",
            "dropout": "0",
            "activation_checkpointing": str(checkpointing).lower(),
        }
    )
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        run_training(OptML.from_env(), cfg)
    rates = [float(x) for x in re.findall(r"tokens_per_second=([0-9.e+]+)", buf.getvalue())]
    steady = rates[1:-1] or rates  # first interval: allocator warm-up; last: may be short
    return {"tokens_per_s": statistics.fmean(steady), "base_rss": base, "peak_rss": peak_rss()}


def child_trainer(root: Path, model_dir: Path, blocks_path: Path, method: str, steps: int,
                  warmup: int) -> dict:  # fmt: skip
    imports()
    import peft
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.hf_trainer import trainer_tokens_per_s
    from sluice.data import PackedBlocks

    base = rss_now()
    tok = AutoTokenizer.from_pretrained(model_dir)
    blocks = PackedBlocks(blocks_path, BLOCK, len(tok))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if method == "lora":
        model = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", **LORA))
    rate = trainer_tokens_per_s(
        model, blocks, batch=BATCH, steps=steps, warmup=warmup, lr=LR, warmup_lr=WARMUP_LR,
        out=root / "hf",
    )  # fmt: skip
    return {"tokens_per_s": rate, "base_rss": base, "peak_rss": peak_rss()}


def prepare(tmp: Path) -> tuple[Path, Path, Path]:
    """Corpus, a BPE tokenizer trained on it, a random-weight Llama folder, packed blocks."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sluice.data import pack_tokens, read_lines
    from sluice.tokenizer import train_bpe
    from sluice_local.corpus import write_corpus

    data = tmp / "data"
    write_corpus(data / "corpus.txt", 20000, seed=3)
    tok = train_bpe(read_lines(data / "corpus.txt"), VOCAB)
    model = tmp / "llama"
    config = LlamaConfig(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **MODEL,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(model)
    tok.save_pretrained(model)
    blocks = tmp / "train.bin"
    pack_tokens(read_lines(data / "corpus.txt"), tok, blocks, tok.eos_token_id)
    return data, model, blocks


def run_child(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.train_llama", "--child", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    if out.returncode != 0:
        raise RuntimeError(out.stdout[-3000:] + out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def planned(model: Path, method: str, checkpointing: bool) -> float:
    from sluice_local import plan

    shape = plan.model_shape(plan.load_config(model), method, LORA["r"])
    return plan.estimate(
        shape, method=method, processes=1, bf16=False, batch_size=BATCH, block_size=BLOCK,
        activation_checkpointing=checkpointing, fused_attention=False,
    ).total  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/train_llama.json")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        tool, root, model, source, method, *rest = args.child
        if tool == "sluice":
            r = child_sluice(Path(root), Path(model), Path(source), method, args.steps,
                             args.warmup, rest == ["checkpointing"])  # fmt: skip
        else:
            r = child_trainer(Path(root), Path(model), Path(source), method, args.steps,
                              args.warmup)  # fmt: skip
        print(json.dumps(r))
        return

    import torch

    tmp = Path(tempfile.mkdtemp(prefix="bench-llama-"))
    data, model, blocks = prepare(tmp)
    runs: dict[str, list[dict]] = {}
    cases = [
        ("sluice", "full", str(data), []),
        ("trainer", "full", str(blocks), []),
        ("sluice", "lora", str(data), []),
        ("trainer", "lora", str(blocks), []),
    ]
    for r in range(args.repeats):
        for tool, method, source, extra in cases:
            root = tmp / f"{tool}-{method}-{r}"
            res = run_child(tool, str(root), str(model), source, method, *extra)
            runs.setdefault(f"{tool} {method}", []).append(res)
            print(f"{tool:8} {method:5} round {r}: {res['tokens_per_s']:.0f} tokens/s, peak "
                  f"{(res['peak_rss'] - res['base_rss']) / 2**20:.0f} MiB", flush=True)  # fmt: skip
    ckpt = run_child("sluice", str(tmp / "sluice-ckpt"), str(model), str(data), "full",
                     "checkpointing")  # fmt: skip
    runs["sluice full checkpointing"] = [ckpt]

    def med(key: str, field: str) -> float:
        if field == "memory":
            return statistics.median(x["peak_rss"] - x["base_rss"] for x in runs[key])
        return statistics.median(x[field] for x in runs[key])

    from sluice_local import plan

    shape = plan.model_shape(plan.load_config(model))
    result = {
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "model": {**MODEL, "vocab_size": shape.vocab, "parameters": shape.parameters},
        "batch_size": BATCH,
        "block_size": BLOCK,
        "steps": args.steps,
        "runs": runs,
        "summary": {},
    }
    for method in ("full", "lora"):
        result["summary"][method] = {
            "sluice_tokens_per_s": med(f"sluice {method}", "tokens_per_s"),
            "trainer_tokens_per_s": med(f"trainer {method}", "tokens_per_s"),
            "tokens_per_s_ratio": med(f"sluice {method}", "tokens_per_s")
            / med(f"trainer {method}", "tokens_per_s"),
            "sluice_peak_bytes": med(f"sluice {method}", "memory"),
            "trainer_peak_bytes": med(f"trainer {method}", "memory"),
            "plan_bytes": planned(model, method, False),
        }
    result["summary"]["full_checkpointing"] = {
        "sluice_peak_bytes": med("sluice full checkpointing", "memory"),
        "plan_bytes": planned(model, "full", True),
        "sluice_tokens_per_s": med("sluice full checkpointing", "tokens_per_s"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    mib = 2**20
    print(f"\nLlama {shape.parameters / 1e6:.1f}M params, batch {BATCH}x{BLOCK}, CPU, "
          f"{torch.get_num_threads()} threads, medians of {args.repeats}")  # fmt: skip
    print(f"{'':22}{'Sluice tok/s':>13}{'Trainer tok/s':>15}{'ratio':>7}"
          f"{'Sluice MiB':>12}{'Trainer MiB':>13}{'plan MiB':>10}")  # fmt: skip
    for key, s in result["summary"].items():
        print(
            f"{key:22}{s['sluice_tokens_per_s']:>13.0f}"
            f"{s.get('trainer_tokens_per_s', float('nan')):>15.0f}"
            f"{s.get('tokens_per_s_ratio', float('nan')):>7.2f}"
            f"{s['sluice_peak_bytes'] / mib:>12.0f}"
            f"{s.get('trainer_peak_bytes', float('nan')) / mib:>13.0f}"
            f"{s['plan_bytes'] / mib:>10.0f}"
        )


if __name__ == "__main__":
    main()
