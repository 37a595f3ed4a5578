"""Serving memory: peak RSS of the serve process while it answers one large payload of short lines.

The claim under test: a request costs the payload (at most MaxPayloadInMB) plus one window of
records, not memory proportional to the number of records. The serve process gets payloads of
growing size (next_token on short lines: the most records per byte); its peak RSS above the idle
process is read from /proc (VmHWM, reset between payloads) and reported against the payload size.

    python -m benchmarks.serve_memory [--sizes-mb 10,50,100]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def build_model(out: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    from sluice.tokenizer import train_bpe
    from sluice_local.corpus import generate

    tok = train_bpe(generate(3000, seed=1), 512)
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_layer=2,
        n_head=2,
        n_embd=64,
        n_positions=128,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    GPT2LMHeadModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def rss_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="10,50,100")
    ap.add_argument("--out", default="benchmarks/results/serve_memory.json")
    args = ap.parse_args()
    from sluice_local.transform import ServeProcess, TransformConfig

    model = build_model(Path(tempfile.mkdtemp(prefix="bench-mem-")) / "model")
    server = ServeProcess(
        model,
        {
            "SAGEMAKER_MAX_PAYLOAD_IN_MB": "100",
            "SLUICE_TASK": "next_token",
            "SAGEMAKER_BATCH": "true",
            "SLUICE_INVOCATION_TIMEOUT": "3000",
        },
    )
    cfg = TransformConfig(content_type="text/plain", timeout_s=3000, max_retries=0)
    rows = []
    try:
        server.wait_ready()
        server.invoke(b"The cat eats\nThe dog", cfg)  # warm-up
        pid = server.proc.pid
        idle = rss_kb(pid, "VmRSS")
        line = b"The lazy cat eats fish"
        for mb in [int(x) for x in args.sizes_mb.split(",")]:
            n = mb * 2**20 // (len(line) + 1)
            body = b"\n".join([line] * n)
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset the peak (VmHWM)
            t0 = time.perf_counter()
            out = server.invoke(body, cfg)
            dt = time.perf_counter() - t0
            assert out.count(b"\n") == n - 1, "one output line per input line"
            peak = rss_kb(pid, "VmHWM")
            rows.append(
                {
                    "payload_mb": mb,
                    "records": n,
                    "seconds": round(dt, 1),
                    "idle_rss_mb": idle / 1024,
                    "peak_rss_mb": peak / 1024,
                    "growth_mb": (peak - idle) / 1024,
                    "growth_per_payload_mb": (peak - idle) / 1024 / mb,
                }
            )
            print(
                f"{mb:4d} MB, {n:>9,} records: {dt:6.1f} s, peak RSS {peak / 1024:7.0f} MB "
                f"(idle {idle / 1024:.0f} MB, +{(peak - idle) / 1024:.0f} MB = "
                f"{(peak - idle) / 1024 / mb:.1f}x the payload)",
                flush=True,
            )
    finally:
        server.stop()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
