"""OpenAI batch lines vs native records: the same prompts through one `sluice serve`.

Both runs ask for the same work (greedy, 32 new tokens, per-record usage) on the same server, as
Batch Transform sends it (MultiRecord JSON Lines, as many requests in flight as
/execution-parameters says); interleaved rounds, medians. The ratio is native time / OpenAI time
(≥ 0.95 is the target: the format costs parsing and wrapping only), and the texts must be equal.

    python -m benchmarks.openai_format [--records 512] [--repeats 6] [--size small]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.serve_throughput import NEW_TOKENS, SIZES, build_model, prompts, sluice_run, timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--size", choices=list(SIZES), default="small")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from sluice_local.transform import ServeProcess

    model_dir = build_model(Path(tempfile.mkdtemp(prefix="bench-openai-")), args.size)
    texts = prompts(AutoTokenizer.from_pretrained(model_dir), args.records, seed=1, lo=4, hi=48)
    native = [
        {"id": str(i), "text": t, "parameters": {"max_new_tokens": NEW_TOKENS}}
        for i, t in enumerate(texts)
    ]
    body = {"max_tokens": NEW_TOKENS, "temperature": 0}
    openai = [
        {
            "custom_id": str(i),
            "method": "POST",
            "url": "/v1/completions",
            "body": {**body, "prompt": t},
        }
        for i, t in enumerate(texts)
    ]
    server = ServeProcess(model_dir, {"SAGEMAKER_BATCH": "true"})
    runs: dict[str, list[float]] = {"native": [], "openai": []}
    try:
        server.wait_ready()
        conc = server.execution_parameters()["MaxConcurrentTransforms"]
        per = max(1, len(texts) // conc)
        sluice_run(server, native[:8], 8, 1)  # warm-up
        outs = {}
        for r in range(args.repeats):  # alternate which goes first: no order advantage
            for name in ("native", "openai") if r % 2 == 0 else ("openai", "native"):
                records = native if name == "native" else openai
                outs[name], t = timed(sluice_run, server, records, per, conc)
                runs[name].append(t)
    finally:
        server.stop()
    med = {k: statistics.median(v) for k, v in runs.items()}
    a = [o["generated_text"] for o in outs["native"]]
    b = [o["response"]["body"]["choices"][0]["text"] for o in outs["openai"]]
    res = {
        "records": args.records,
        "new_tokens": NEW_TOKENS,
        "native_s": med["native"],
        "openai_s": med["openai"],
        "openai_vs_native": med["native"] / med["openai"],
        "identical": sum(x == y for x, y in zip(a, b, strict=True)) / len(a),
        "runs_s": runs,
    }
    print(json.dumps(res, indent=2))
    print(
        f"OpenAI batch lines at {res['openai_vs_native']:.3f}x native records' throughput "
        f"({args.records} records, medians of {args.repeats}); identical texts "
        f"{res['identical']:.3f}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
