"""`sluice demo`: Sluice's main job on embedded defaults, on one machine with nothing downloaded."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from .corpus import SAMPLE_PROMPTS, write_corpus


def run_demo(workdir: Path, steps: int = 300) -> int:
    workdir = workdir.resolve()
    data = workdir / "data"
    write_corpus(data / "train" / "corpus.txt", 4000, seed=1)
    out = workdir / "job"
    print(f"1/3 training a tiny GPT-2 on the embedded corpus ({steps} steps) -> {out}/model")
    t0 = time.perf_counter()
    cmd = [
        sys.executable, "-m", "sluice.cli", "train", "--train", str(data / "train"),
        "--output", str(out), "--progress",
        "--set", "model_size=tiny", "--set", f"max_steps={steps}", "--set", "batch_size=16",
        "--set", "block_size=64", "--set", "learning_rate=3e-3", "--set", "warmup_steps=20",
        "--set", "log_interval=50", "--set", "checkpoint_interval=0", "--set", "vocab_size=512",
    ]  # fmt: skip
    rc = subprocess.call(cmd)
    if rc != 0:
        failure = out / "output" / "failure"
        print(f"training failed: {failure.read_text() if failure.exists() else rc}")
        return rc
    print(f"   trained in {time.perf_counter() - t0:.0f} s")

    model_dir = out / "model"
    from .model import load_model

    model, tok = load_model(model_dir)
    report = json.loads((model_dir / "evaluation.json").read_text())
    ch = report["challenger"]
    print(
        f"2/3 held-out evaluation: loss {ch['loss']:.3f}, perplexity {ch['perplexity']:.2f} "
        f"over {ch['tokens']} tokens of {ch['records']} records "
        f"(guessing uniformly over the {len(tok)}-token vocabulary: perplexity {len(tok)})"
    )
    print("3/3 what the model predicts:")
    model.eval()
    with torch.inference_mode():
        for prompt in SAMPLE_PROMPTS:
            ids = tok(prompt, return_tensors="pt")
            probs = torch.softmax(model(**ids).logits[0, -1], dim=-1)
            top = torch.topk(probs, 3)
            nexts = ", ".join(
                f"{tok.decode([int(i)])!r} {p:.2f}"
                for p, i in zip(top.values, top.indices, strict=True)
            )
            gen = model.generate(
                **ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id
            )
            text = tok.decode(gen[0][ids["input_ids"].shape[1] :], skip_special_tokens=True)
            print(f"   {prompt!r:36} next: {nexts:40} greedy: {prompt}{text}")
    print(
        f"artifacts: {model_dir} (edge export in {model_dir / 'edge'}, loss curve loss_curve.png)"
    )
    return 0
