"""Training throughput: Sluice's loop vs Hugging Face `Trainer`, side by side in one process.

Same GPT-2 config, same packed token blocks (Sluice's own preparation), same batch size, same
optimizer settings. Tokens/s are counted over steady-state steps (the first `warmup` steps of each
run are left out) and reported as a ratio. Runs alternate (Sluice, Trainer, Sluice, Trainer, ...)
and the median of each is reported.

    python -m benchmarks.train_throughput [--steps 40] [--repeats 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import tempfile
from pathlib import Path

import torch

MODEL = {"n_layer": 6, "n_head": 4, "n_embd": 256, "n_positions": 128, "vocab_size": 2048}
BATCH, BLOCK, LR = 16, 128, 3e-4


def sluice_run(root: Path, steps: int, warmup: int) -> tuple[float, Path]:
    from sluice.hyperparameters import parse_hyperparameters
    from sluice.paths import OptML
    from sluice.train import run_training

    os.environ["SLUICE_OPT_ML"] = str(root)
    for p in ("model", "checkpoints", "output"):
        (root / p).mkdir(parents=True, exist_ok=True)
    cfg = parse_hyperparameters(
        {
            "model_size": "small",
            **{k: str(v) for k, v in MODEL.items()},
            "block_size": str(BLOCK),
            "batch_size": str(BATCH),
            "learning_rate": str(LR),
            "max_steps": str(steps),
            "warmup_steps": "10",
            "log_interval": str(warmup),
            "checkpoint_interval": "0",
            "export_edge": "false",
            "loss_curve": "false",
            "eval_max_records": "50",
        }
    )
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        run_training(OptML.from_env(), cfg)
    rates = [float(x) for x in re.findall(r"tokens_per_second=([0-9.e+]+)", buf.getvalue())]
    # each line covers `warmup` steps; drop the first interval (compilation, allocator warm-up)
    steady = rates[1:] or rates
    return statistics.fmean(steady), root / "sluice-work"


def trainer_run(work: Path, steps: int, warmup: int, device: str) -> float:
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from benchmarks.hf_trainer import trainer_tokens_per_s
    from sluice.data import PackedBlocks

    tok = AutoTokenizer.from_pretrained(work / "tokenizer")
    blocks = PackedBlocks(work / "train.bin", BLOCK, len(tok))
    torch.manual_seed(0)
    cfg = {k: v for k, v in MODEL.items() if k != "vocab_size"}
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), **cfg))
    return trainer_tokens_per_s(
        model, blocks, batch=BATCH, steps=steps, warmup=warmup, lr=LR, warmup_lr=10,
        out=work / "hf", device=device,
    )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="benchmarks/results/train_throughput.json")
    args = ap.parse_args()

    from sluice_local.corpus import write_corpus

    tmp = Path(tempfile.mkdtemp(prefix="bench-train-"))
    write_corpus(tmp / "data" / "corpus.txt", 30000, seed=3)
    os.environ["SM_CHANNEL_TRAIN"] = str(tmp / "data")
    sluice, hf = [], []
    for r in range(args.repeats):
        rate, work = sluice_run(tmp / f"sluice-{r}", args.steps, args.warmup)
        sluice.append(rate)
        hf.append(trainer_run(work, args.steps, args.warmup, args.device))
    from transformers import GPT2Config, GPT2LMHeadModel

    params = sum(p.numel() for p in GPT2LMHeadModel(GPT2Config(**MODEL)).parameters())
    result = {
        "device": args.device,
        "threads": torch.get_num_threads(),
        "model": {**MODEL, "parameters": params},
        "batch_size": BATCH,
        "block_size": BLOCK,
        "steps": args.steps,
        "warmup_steps_excluded": args.warmup,
        "sluice_tokens_per_s": sluice,
        "trainer_tokens_per_s": hf,
        "ratio": statistics.median(sluice) / statistics.median(hf),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"\ntraining throughput, GPT-2 {params / 1e6:.1f}M params, batch {BATCH}x{BLOCK}, "
        f"{args.device}, {torch.get_num_threads()} threads"
    )
    print(f"{'':24}{'tokens/s (median)':>20}{'runs':>30}")
    print(f"{'HF Trainer':24}{statistics.median(hf):>20.0f}{[round(x) for x in hf]!s:>30}")
    print(f"{'Sluice':24}{statistics.median(sluice):>20.0f}{[round(x) for x in sluice]!s:>30}")
    print(f"ratio Sluice / Trainer: {result['ratio']:.2f}x")


if __name__ == "__main__":
    main()
