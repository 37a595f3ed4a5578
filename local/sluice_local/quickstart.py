"""`sluice-local quickstart`: train a tiny model and batch-transform files, with no AWS APIs at all.

The container's real `sluice train`, then the local Batch Transform driver against its real
`sluice serve`: a minute on 2 cores, nothing downloaded, nothing started but processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from .corpus import sample_files, write_corpus


def run_quickstart(workdir: Path, steps: int = 300) -> int:
    """Train, evaluate and batch-transform the sample prompts under `workdir`; 0 when all ran."""
    workdir = workdir.resolve()
    data = workdir / "data"
    write_corpus(data / "train" / "corpus.txt", 4000, seed=1)
    out = workdir / "job"
    print(f"1/3 training a tiny GPT-2 on the embedded corpus ({steps} steps) -> {out}/model")
    t0 = time.perf_counter()
    cmd = [
        sys.executable,
        "-m",
        "sluice.cli",
        "train",
        "--train",
        str(data / "train"),
        "--output",
        str(out),
        "--progress",
        "--set",
        "model_size=tiny",
        "--set",
        f"max_steps={steps}",
        "--set",
        "batch_size=16",
        "--set",
        "block_size=64",
        "--set",
        "learning_rate=3e-3",
        "--set",
        "warmup_steps=20",
        "--set",
        "log_interval=50",
        "--set",
        "checkpoint_interval=0",
        "--set",
        "vocab_size=512",
    ]
    rc = subprocess.call(cmd)
    if rc != 0:
        failure = out / "output" / "failure"
        print(f"training failed: {failure.read_text() if failure.exists() else rc}")
        return rc
    print(f"   trained in {time.perf_counter() - t0:.0f} s")

    model_dir = out / "model"
    from sluice.model import load_model

    _, tok = load_model(model_dir)
    report = json.loads((model_dir / "evaluation.json").read_text())
    ch = report["challenger"]
    print(
        f"2/3 held-out evaluation: loss {ch['loss']:.3f}, perplexity {ch['perplexity']:.2f} "
        f"over {ch['tokens']} tokens of {ch['records']} records "
        f"(guessing uniformly over the {len(tok)}-token vocabulary: perplexity {len(tok)})"
    )
    print("3/3 batch transform of dropped files, through the real serve process:")
    incoming = data / "incoming"
    incoming.mkdir(parents=True, exist_ok=True)
    for name, lines in sample_files().items():
        (incoming / name).write_text("\n".join(lines) + "\n")
    from .transform import TransformConfig, run_transform

    summary = run_transform(model_dir, str(incoming), str(workdir / "outputs"), TransformConfig())
    for f in summary["files"]:
        print(
            f"   {Path(f['uri']).name} -> {f['output']} ({f['records']} lines, "
            f"{f['error_lines']} error lines)"
        )
        inputs = Path(f["uri"]).read_text().splitlines()
        outputs = Path(f["output"]).read_text().splitlines()
        for line_in, line_out in zip(inputs, outputs, strict=True):
            print(f"     {show_line(line_in, line_out)}")
    print(f"artifacts: {model_dir} (edge export in edge/, loss curve loss_curve.png)")
    return 0 if summary["TransformJobStatus"] == "Completed" else 1


def show_line(line_in: str, line_out: str) -> str:
    """One input line beside what the model made of it, for people."""
    out = json.loads(line_out)
    try:
        text = json.loads(line_in)["text"]
    except (ValueError, KeyError):
        text = line_in
    if "error" in out:
        return f"{text!r:44} -> error {out['error']['code']}: {out['error']['message']}"
    if out["task"] == "generate":
        return f"{text!r:44} -> {text}{out['generated_text']}"
    if out["task"] == "score":
        return f"{text!r:44} -> perplexity {out['perplexity']:.2f}"
    tops = ", ".join(f"{t['token']!r} {t['prob']:.2f}" for t in out["next_tokens"])
    return f"{text!r:44} -> next: {tops}"
