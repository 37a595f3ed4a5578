"""vLLM's CPU engine processes: what `sluice serve` sets, against vLLM's defaults.

AsyncLLM always runs its engine core in a process of its own. On CPUs vLLM's default then starts
the model in a further worker process (the multiprocess executor, another import of torch and
vLLM); with `VLLM_ENABLE_V1_MULTIPROCESSING=0` (and `OMP_NUM_THREADS` = the cores, which vLLM
would otherwise cut to one thread there) the engine core runs the model itself. vLLM's CPU
platform also starts the engine core with `spawn` (a fresh interpreter importing torch and vLLM
again); `sluice serve` forks it from the server process, which has them imported already.
Each mode through the real `sluice serve`, in alternating rounds on the same model (GPT-2
architecture, ~14M, random weights) and prompts, called as Batch Transform calls it (one
MultiRecord request): seconds to /ping 200, to generate (384 prompts, greedy, 32 new tokens) and
score them, to stop after SIGTERM, and how many generated lines match Sluice's.

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

SPAWN = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
MODES = {
    "vLLM default (spawned, worker process)": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", **SPAWN},
    "engine core spawned, model in it": SPAWN,
    "sluice (forked, model in it)": {},  # what sluice.engine sets unless given
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
        print(f"{mode:40s}", "  ".join(f"{k} {v:6.2f} s" for k, v in figures.items()))
    *others, sluice = MODES
    ours = med[sluice]
    for mode in others:
        them = med[mode]
        same = sum(x == y for x, y in zip(outs[mode], outs[sluice], strict=True))
        print(
            f"sluice vs {mode}: ready {them['ready'] - ours['ready']:.1f} s sooner, "
            f"generation {them['generate'] / ours['generate']:.3f}x, "
            f"scoring {them['score'] / ours['score']:.3f}x, "
            f"stop {them['stop'] - ours['stop']:.1f} s sooner, "
            f"identical output lines {same}/{len(outs[sluice])}"
        )


if __name__ == "__main__":
    main()
