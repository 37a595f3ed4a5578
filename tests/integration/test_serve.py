"""The real `serve` process on a free port: SageMaker's contract, formats, order, errors, drain."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from sluice.malloc import find_tcmalloc
from sluice_local.corpus import generate
from tests.helpers import Server, free_port, run_sluice

# Seconds of work for vLLM on 2 cores (at least 40 new tokens each: eos is never reached early)
LONG_BATCH = [
    {"id": i, "text": t, "parameters": {"max_new_tokens": 60, "stop": ["\u2603"]}}
    for i, t in enumerate(generate(800, seed=11))
]


# the plain server is test_serve_edge's too (tests/conftest.py): both modules on one xdist worker
pytestmark = pytest.mark.xdist_group("plain-server")


@pytest.fixture(scope="module")
def server(plain_server):
    return plain_server


def test_ping_and_execution_parameters(server):
    # an endpoint's batch sizes; records sharing a prefix reuse its KV cache
    assert "up to 128 sequences and 2048 tokens a step, prefix caching on" in "".join(server.log)
    status, body = server.get("/ping")
    assert (status, body) == (200, b"")
    status, body = server.get("/execution-parameters")
    params = json.loads(body)
    assert status == 200
    assert params["BatchStrategy"] == "MULTI_RECORD"
    assert params["MaxConcurrentTransforms"] * params["MaxPayloadInMB"] <= 100
    assert params["MaxPayloadInMB"] >= 1


def test_serve_runs_on_tcmalloc_where_it_is_installed(server):
    """vLLM's CPU guide asks for tcmalloc in LD_PRELOAD: `serve` re-executes itself with it, and
    vLLM's engine process inherits it. CI installs it (`make system-packages`)."""
    lib = find_tcmalloc()
    if lib is None:
        assert not os.environ.get("CI"), "CI installs libtcmalloc-minimal4 (make system-packages)"
        pytest.skip("no tcmalloc here: apt-get install libtcmalloc-minimal4")
    assert f"memory allocator: tcmalloc ({lib};" in "".join(server.log)
    serve = psutil.Process(server.proc.pid)  # os.execve keeps the process id
    for proc in [serve, *serve.children(recursive=True)]:
        assert "libtcmalloc" in Path(f"/proc/{proc.pid}/maps").read_text(), proc.name()


def test_vllms_engine_process_is_forked_not_started_afresh(server):
    """vLLM's CPU platform starts its engine process with `spawn`: a new interpreter that imports
    torch and vLLM all over again (~16 s of CPU at every start here). `serve` forks it from
    itself instead, so the engine process shares serve's imported modules copy-on-write: memory
    both have written and neither has since (measured: 280 MB forked, 0 spawned)."""
    assert "engine process forked" in "".join(server.log)
    serve = psutil.Process(server.proc.pid)
    [core] = [p for p in serve.children(recursive=True) if "EngineCore" in " ".join(p.cmdline())]
    rollup = Path(f"/proc/{core.pid}/smaps_rollup").read_text()
    shared_kb = int(re.search(r"^Shared_Dirty:\s+(\d+) kB", rollup, re.M)[1])
    assert shared_kb > 64 * 1024, rollup


def test_the_first_log_prob_request_compiles_nothing(server):
    """vLLM compiles a few sampler helpers with torch.compile at the first request that asks for
    log-probs, which every generate record does (mean_logprob): inductor writes and builds C++,
    ~2.5 s at every server start on 2 cores. serve runs them eagerly, like the model."""
    [line] = server.lines([{"text": "The lazy cat eats", "parameters": {"max_new_tokens": 3}}])
    assert line["mean_logprob"] < 0
    cache = Path(server.env["TORCHINDUCTOR_CACHE_DIR"])
    assert not [p for p in cache.rglob("*") if p.is_file()]


def test_each_task_and_order_and_ids(server):
    out = server.lines(
        [
            {"id": "a", "text": "The lazy cat eats", "parameters": {"max_new_tokens": 5}},
            {
                "id": 2,
                "text": "In the desert there is often",
                "task": "score",
                "parameters": {"per_token": True},
            },
            {
                "id": None,
                "text": "Every horse likes",
                "task": "next_token",
                "parameters": {"top_k": 3},
            },
            {"inputs": "Anna gave the rabbit some", "parameters": {"max_new_tokens": 3}},
        ]
    )
    assert [o.get("id", "absent") for o in out] == ["a", 2, None, "absent"]
    assert out[0]["task"] == "generate" and out[0]["tokens"] <= 5
    s = out[1]
    assert s["tokens"] == len(s["token_logprobs"]) == len(s["token_strs"])
    assert s["logprob"] == pytest.approx(sum(s["token_logprobs"]), abs=1e-4)
    assert s["perplexity"] == pytest.approx(2.718281828 ** (-s["mean_logprob"]), rel=1e-6)
    probs = [t["prob"] for t in out[2]["next_tokens"]]
    assert len(probs) == 3 and probs == sorted(probs, reverse=True) and sum(probs) <= 1.0


@pytest.mark.parametrize(
    "body, ctype, expected",
    [
        ('{"text": "a cat"}\r\n{"text": "a dog"}\r\n', "application/jsonlines", 2),
        ('{"text": "a cat"}\n{"text": "a dog"}', "application/x-jsonlines; charset=utf-8", 2),
        ('[{"text": "a cat"}, {"text": "a dog"}, {"text": "a cow"}]', "application/json", 3),
        ('{"text": "a cat"}', "application/json", 1),
        ("The cat\nThe dog\nThe cow\n", "text/plain", 3),
        ('The cat\n"The dog, the cow"\n', "text/csv", 2),
    ],
)
def test_content_types_give_one_line_per_record(server, body, ctype, expected):
    status, text, headers = server.post(body, ctype)
    assert status == 200, text
    assert headers["Content-Type"] == "application/jsonlines"
    lines = text.split("\n")
    assert len(lines) == expected and all("generated_text" in json.loads(x) for x in lines)


def test_json_array_out_when_asked(server):
    status, text, headers = server.post('{"text": "a"}\n{"text": "b"}', accept="application/json")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert len(json.loads(text)) == 2


def test_bad_records_get_error_lines_and_the_rest_is_served(server):
    body = (
        "\n".join(
            [
                '{"id": 1, "text": "The cat"}',
                "{not json",
                '{"id": 3, "text": 42}',
                '{"id": 4, "text": "x", "task": "translate"}',
                '{"id": 5, "text": "x", "parameters": {"max_new_tokens": "ten"}}',
                '{"id": 6, "text": "x", "parameters": {"nucleus": 0.9}}',
                '{"id": 7, "text": "   "}',
                json.dumps({"id": 8, "text": "cat " * 200, "parameters": {"truncation": "error"}}),
                json.dumps({"id": 9, "text": "cat " * 200, "parameters": {"max_new_tokens": 2}}),
                "",
                '{"id": 11, "text": "The dog"}',
            ]
        ).encode()
        + b"\n"
        + b'{"id": 12, "text": "caf\xe9"}'
    )
    status, text, _ = server.post(body)
    assert status == 200
    out = [json.loads(x) for x in text.split("\n")]
    codes = [o.get("error", {}).get("code") for o in out]
    assert codes == [
        None,
        "invalid_json",
        "invalid_text",
        "unknown_task",
        "invalid_parameter",
        "invalid_parameter",
        "empty_text",
        "too_long",
        None,
        "invalid_json",
        None,
        "invalid_utf8",
    ]
    assert out[8]["generated_text"] is not None  # truncated from the left by default
    assert [o.get("id") for o in out if "id" in o] == [1, 3, 4, 5, 6, 7, 8, 9, 11]


@pytest.mark.parametrize(
    "body, ctype, status, hint",
    [
        (b'{"text": "a"}', "application/xml", 415, "send application/jsonlines"),
        ('{"text": "a"}\n'.encode("utf-16"), "application/jsonlines", 400, "UTF-8"),
        (b'{"text": "a"}\n{"text": "b"}', "application/json", 400, "send application/jsonlines"),
    ],
)
def test_unreadable_bodies_are_4xx_with_what_to_send(server, body, ctype, status, hint):
    got, text, _ = server.post(body, ctype)
    assert got == status
    assert hint in json.loads(text)["error"]["message"]


def test_payload_over_the_limit_is_413(server):
    status, text, _ = server.post(("The cat\n" * 900_000).encode(), "text/plain")
    assert status == 413 and "MaxPayloadInMB" in text
    assert server.post("The cat", "text/plain")[0] == 200


def long_request(server: Server) -> tuple[threading.Thread, dict]:
    """Send LONG_BATCH from a thread; the dict gets the response lines under "resp"."""
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(resp=server.lines(LONG_BATCH)))
    t.start()
    return t, result


def test_ping_answers_during_a_long_request(server):
    t, result = long_request(server)
    time.sleep(0.2)
    pings = []
    while t.is_alive() and len(pings) < 5:
        t0 = time.monotonic()
        assert server.get("/ping")[0] == 200
        pings.append(time.monotonic() - t0)
    t.join()
    assert pings, "the long request finished before any ping was sent"
    assert max(pings) < 2.0  # SageMaker's ping deadline
    assert len(result["resp"]) == len(LONG_BATCH)


def test_greedy_output_is_the_same_alone_or_in_a_batch_of_500(server):
    records = [
        {"id": i, "text": t, "parameters": {"max_new_tokens": 8}}
        for i, t in enumerate(generate(500, seed=21))
    ]
    batched = server.lines(records)
    for i in range(0, 500, 50):
        alone = server.lines([records[i]])[0]
        assert alone["generated_text"] == batched[i]["generated_text"], i
    scored = server.lines([{**r, "task": "score", "parameters": {}} for r in records[:200]])
    for i in (0, 7, 99, 199):
        alone = server.lines([{**records[i], "task": "score", "parameters": {}}])[0]
        assert alone["logprob"] == pytest.approx(scored[i]["logprob"], abs=1e-4)


def test_seeded_sampling_is_reproducible_in_any_batch(server):
    rec = {
        "id": 0,
        "text": "The cat",
        "parameters": {"do_sample": True, "temperature": 1.5, "seed": 7, "max_new_tokens": 12},
    }
    others = [{"text": t, "parameters": {"do_sample": True}} for t in generate(30, seed=2)]
    a = server.lines([rec])[0]["generated_text"]
    b = server.lines([*others[:10], rec, *others[10:]])[10]["generated_text"]
    c = server.lines([{**rec, "parameters": {**rec["parameters"], "seed": 8}}])[0]
    assert a == b
    several = server.lines(
        [{**rec, "parameters": {**rec["parameters"], "num_return_sequences": 3}}]
    )[0]
    assert several["generations"][0]["generated_text"] == a
    assert len({g["generated_text"] for g in several["generations"]} | {c["generated_text"]}) > 1


def test_stop_sequences(server):
    out = server.lines([{"text": "The cat", "parameters": {"stop": [" "], "max_new_tokens": 20}}])
    assert out[0]["finish_reason"] in ("stop", "eos")
    if out[0]["finish_reason"] == "stop":
        assert " " not in out[0]["generated_text"]


def test_concurrent_requests_are_merged_and_each_gets_its_own_lines(server):
    results = {}

    def call(k):
        recs = [
            {"id": f"{k}-{i}", "text": t, "task": "score"}
            for i, t in enumerate(generate(40, seed=k))
        ]
        results[k] = server.lines(recs)

    threads = [threading.Thread(target=call, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, lines in results.items():
        assert [o["id"] for o in lines] == [f"{k}-{i}" for i in range(40)]


@pytest.mark.slow
def test_a_bfloat16_checkpoint_is_served_in_its_own_dtype(tmp_path, trained):
    """Most published models are saved in bfloat16: `auto` serves them so on CPUs that run bf16
    natively (AMX, AVX512-BF16) and on GPUs, instead of upcasting; scoring runs in the same
    dtype. The scores are those of the checkpoint computed in that dtype by plain transformers."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sluice.scoring import encode_for_scoring
    from sluice.serve import cpu_bf16_flags

    model = tmp_path / "bf16"
    shutil.copytree(trained["model"], model)
    AutoModelForCausalLM.from_pretrained(model).to(torch.bfloat16).save_pretrained(model)
    expected = torch.bfloat16 if cpu_bf16_flags() else torch.float32
    texts = ["The lazy cat eats fish", "Every rabbit likes hay in the morning"]
    s = Server(model)
    try:
        lines = s.lines(
            [{"id": i, "text": t, "task": "score"} for i, t in enumerate(texts)]
            + [{"id": "g", "text": texts[0], "parameters": {"max_new_tokens": 8}}]
        )
    finally:
        s.stop()
    name = str(expected).removeprefix("torch.")
    assert any(f"dtype {name}: " in line for line in s.log), "".join(s.log)
    assert lines[2]["id"] == "g" and lines[2]["tokens"] > 0, lines[2]
    tok = AutoTokenizer.from_pretrained(model)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=expected).eval()
    for ids, line in zip(encode_for_scoring(tok, texts), lines, strict=False):
        ids = torch.tensor([ids])
        with torch.no_grad():
            logp = hf(ids).logits[0, :-1].float().log_softmax(-1)
        mean = logp.gather(1, ids[0, 1:, None]).mean().item()
        assert line["mean_logprob"] == pytest.approx(mean, abs=0.05), (line, mean)


@pytest.mark.slow
def test_sigterm_finishes_the_request_in_flight_then_exits(trained):
    s = Server(trained["model"])
    t, result = long_request(s)
    time.sleep(1.0)
    s.proc.send_signal(signal.SIGTERM)
    t.join(timeout=120)
    assert s.proc.wait(timeout=60) == 0
    assert len(result["resp"]) == len(LONG_BATCH)
    assert all("generated_text" in o for o in result["resp"])
    with pytest.raises(OSError):
        s.get("/ping")
    assert any("draining 1 in flight" in line for line in s.log), "".join(s.log)
    assert "EngineDeadError" not in "".join(s.log)  # a clean stop logs no engine failure


@pytest.mark.slow
def test_a_dead_engine_fails_its_records_and_the_server_exits_1(trained):
    """vLLM's engine process killed (the OOM killer, a crash) mid-request: the records in flight
    get `engine_failed` lines, /ping stops answering 200 and the server exits 1, so that
    SageMaker replaces the instance or fails the transform job instead of a server that errs on
    every record while its health check passes."""
    import psutil

    s = Server(trained["model"], SAGEMAKER_BATCH="true")
    try:
        # Batch Transform: vLLM's offline (throughput) batch sizes, not its server ones
        assert "up to 256 sequences and 4096 tokens a step" in "".join(s.log)
        cores = [
            p
            for p in psutil.Process(s.proc.pid).children(recursive=True)
            if "EngineCore" in " ".join(p.cmdline())
        ]
        assert cores, "no EngineCore process under serve"
        thread, result = long_request(s)
        time.sleep(0.5)  # the records reach the engine (the whole batch takes ~2 s here)
        assert thread.is_alive(), "the request ended before the engine was killed"
        for p in cores:
            p.kill()
        thread.join(timeout=120)
        lines = result["resp"]  # a 200, one line per record
        assert len(lines) == len(LONG_BATCH)
        codes = {o["error"]["code"] for o in lines if "error" in o}
        assert codes == {"engine_failed"}, codes
        assert s.proc.wait(timeout=120) == 1
    finally:
        s.stop()
    assert "the vLLM engine died" in "".join(s.log)


@pytest.mark.slow
def test_a_model_the_cpu_engine_cannot_run_is_refused_at_start(tmp_path, trained):
    """A Llama with 16-dimensional heads: vLLM's CPU attention runs 32-512, and vLLM would
    start, answer /ping, then fail every record. serve exits 1 and says why instead."""
    from tests.helpers import tiny_llama

    model = tiny_llama(tmp_path / "narrow-heads", trained["model"], heads=4)  # 64 / 4 = 16
    args = ["serve", "--model-dir", str(model), "--host", "127.0.0.1"]
    port = {"SAGEMAKER_BIND_TO_PORT": str(free_port())}
    proc = run_sluice(*args, env=port, check=False, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "cannot serve" in out and "16-dimensional" in out and "GPU" in out, out
    assert "Traceback" not in out
