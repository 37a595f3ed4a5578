"""vLLM's CPU engine in one process or two: what `sluice serve` sets, against vLLM's default.

AsyncLLM always runs its engine core in a process of its own. On CPUs vLLM's default then starts
the model in a further worker process (the multiprocess executor, another import of torch and
vLLM); with `VLLM_ENABLE_V1_MULTIPROCESSING=0` (and `OMP_NUM_THREADS` = the cores, which vLLM
would otherwise cut to one thread there) the engine core runs the model itself. Both through the
real `sluice serve`, in alternating rounds on the same model (GPT-2 architecture, ~14M, random
weights) and prompts, called as Batch Transform calls it (one MultiRecord request): seconds to
/ping 200, to generate (384 prompts, greedy, 32 new tokens) and score them, to stop after SIGTERM,
and how many generated lines are identical.

    python -m benchmarks.engine_processes [--records 384] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.serve_throughput import NEW_TOKENS, build_model, prompts

MODES = {
    "vLLM default (worker process)": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    "sluice (model in the engine core)": {},  # what sluice.engine sets unless given
}


def post(url: str, body: bytes) -> tuple[float, list[str]]:
    req = urllib.request.Request(
        url + "/invocations", data=body, headers={"Content-Type": "application/jsonlines"}
    )
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=900) as r:
        out = r.read().decode().splitlines()
    return time.perf_counter() - t, out


def main() -> None:
    from transformers import AutoTokenizer

    from sluice_local.transform import ServeProcess

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=384)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp))
        tok = AutoTokenizer.from_pretrained(model)
        texts = prompts(tok, args.records, 1, 4, 48)
        gen = [{"text": t, "parameters": {"max_new_tokens": NEW_TOKENS}} for t in texts]
        gen_body = "\n".join(map(json.dumps, gen)).encode()
        score_body = "\n".join(json.dumps({"text": t, "task": "score"}) for t in texts).encode()
        res = {m: {"ready": [], "generate": [], "score": [], "stop": []} for m in MODES}
        outs: dict[str, list[str]] = {}
        for _ in range(args.rounds):
            for mode, env in MODES.items():
                t = time.perf_counter()
                server = ServeProcess(model, {"SAGEMAKER_BATCH": "true", **env})
                server.wait_ready(600)
                res[mode]["ready"].append(time.perf_counter() - t)
                post(server.url, "\n".join(map(json.dumps, gen[:8])).encode())  # first request
                took, outs[mode] = post(server.url, gen_body)
                res[mode]["generate"].append(took)
                res[mode]["score"].append(post(server.url, score_body)[0])
                t = time.perf_counter()
                server.stop()
                res[mode]["stop"].append(time.perf_counter() - t)
    med = {m: {k: statistics.median(v) for k, v in r.items()} for m, r in res.items()}
    for mode, figures in med.items():
        print(f"{mode:36s}", "  ".join(f"{k} {v:6.2f} s" for k, v in figures.items()))
    default, ours = (med[m] for m in MODES)
    print(
        f"one process vs vLLM's default: ready {default['ready'] - ours['ready']:.1f} s sooner, "
        f"generation {default['generate'] / ours['generate']:.3f}x, "
        f"scoring {default['score'] / ours['score']:.3f}x, "
        f"stop {default['stop'] - ours['stop']:.1f} s sooner"
    )
    a, b = (outs[m] for m in MODES)
    print(f"identical output lines: {sum(x == y for x, y in zip(a, b, strict=True))}/{len(a)}")


if __name__ == "__main__":
    main()
