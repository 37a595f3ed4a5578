"""Several LoRA adapters of one base, served together: each record picks its own (vLLM multi-LoRA).

One `sluice serve` on a tiny Llama whose artifact carries four named adapters under `adapters/`
(two ranks), and records of every adapter and of the base interleaved in one request. Each
answer is checked against PEFT applying that adapter in torch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from openai.types import Completion
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers import Server, free_port, run_sluice, tiny_llama

NAMES = ["legal", "medical", "support-v2", "tone.casual"]
PROMPTS = ["The lazy cat eats", "In the desert there is often", "Every horse likes"]

pytestmark = pytest.mark.slow  # a vLLM engine with five LoRA adapters: ~60 s to start


def with_adapters(folder: Path, tokenizer_from: Path) -> Path:
    """A tiny Llama with four random (non-zero) LoRA adapters, ranks 8 and 16."""
    from peft import LoraConfig, get_peft_model

    base = tiny_llama(folder, tokenizer_from, heads=2)
    # random weights give near-uniform next-token probabilities, whose top-5 order is float
    # noise: a sharper output layer makes the order (and each adapter's effect) well defined
    model = AutoModelForCausalLM.from_pretrained(base)
    with torch.no_grad():
        model.lm_head.weight.mul_(40)
    model.save_pretrained(base)
    for i, name in enumerate(NAMES):
        torch.manual_seed(100 + i)
        config = LoraConfig(
            r=8 * (1 + i % 2),
            lora_alpha=16,
            target_modules=["q_proj", "v_proj"],
            init_lora_weights=False,  # random B: each adapter really moves the output
        )
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), config)
        model.save_pretrained(base / "adapters" / name)
    return base


@pytest.fixture(scope="module")
def served(trained, tmp_path_factory):
    model = with_adapters(tmp_path_factory.mktemp("adapters") / "model", trained["model"])
    server = Server(model)
    yield model, server
    server.stop()


def peft_top(model_dir: Path, adapter: str | None, text: str, k: int = 5) -> dict[int, float]:
    """The next-token top-k of `text` with `adapter` applied by PEFT (None: the base)."""
    from peft import PeftModel

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, model_dir / "adapters" / adapter)
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        probs = model(ids).logits[0, -1].softmax(-1)
    top = probs.topk(k)
    return dict(zip(top.indices.tolist(), top.values.tolist(), strict=True))


def test_records_of_four_adapters_and_the_base_batch_together(served):
    model, server = served
    log = "".join(server.log)
    assert "4 LoRA adapters" in log and "support-v2 (rank 8)" in log, log
    choices = [None, *NAMES]
    records = [
        {"id": f"{a}/{i}", "text": t, "task": "next_token", "parameters": {"top_k": 5}}
        | ({} if a is None else {"adapter": a})
        for i, t in enumerate(PROMPTS)
        for a in choices  # interleaved: every adapter in every batch
    ]
    out = server.lines(records)
    tops = {}
    for rec, got in zip(records, out, strict=True):
        assert got["id"] == rec["id"], got
        served_top = {t["id"]: t["prob"] for t in got["next_tokens"]}
        want = peft_top(model, rec.get("adapter"), rec["text"])
        assert list(served_top) == list(want), (rec, got)
        for i, p in served_top.items():
            assert p == pytest.approx(want[i], rel=1e-3, abs=1e-6), (rec, got)
        tops[rec["id"]] = tuple(served_top)
    # the adapters really differ: not every record of a prompt has the same answer
    for i in range(len(PROMPTS)):
        assert len({tops[f"{a}/{i}"] for a in choices}) > 1


def test_an_adapter_is_chosen_by_name_and_an_unknown_one_is_that_records_error(served):
    _, server = served
    lines = [
        {"id": 1, "text": PROMPTS[0], "adapter": "legal", "parameters": {"max_new_tokens": 6}},
        {
            "custom_id": "c-1",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "legal", "prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0},
        },
        {"id": 2, "text": PROMPTS[0], "adapter": "nope"},
        {"id": 3, "text": PROMPTS[0], "adapter": 7},
        {"id": 4, "text": PROMPTS[0], "task": "score", "adapter": "medical"},
        {"id": 5, "text": PROMPTS[0], "task": "score"},
    ]
    native, openai, unknown, wrong_type, scored, base_score = server.lines(lines)
    body = Completion.model_validate(openai["response"]["body"])
    # an OpenAI line's `model` names the adapter: the same greedy text as the native record
    assert body.choices[0].text == native["generated_text"] and body.model == "legal"
    assert unknown["error"]["code"] == "unknown_adapter" and unknown["id"] == 2
    assert "legal" in unknown["error"]["message"]  # the message lists the adapters there are
    assert wrong_type["error"]["code"] == "invalid_record"
    # scoring with an adapter runs through vLLM with it: not the base's log-prob
    assert scored["tokens"] == base_score["tokens"]
    assert scored["logprob"] != pytest.approx(base_score["logprob"], abs=1e-4)


def test_named_adapters_on_a_model_vllm_cannot_adapt_are_refused_at_start(tmp_path, trained):
    """GPT-2 has no LoRA in vLLM, and several adapters cannot be merged into one model: serve
    exits 1 and says what to do instead of serving records their adapter would not touch."""
    import shutil

    from peft import LoraConfig, get_peft_model

    model = tmp_path / "gpt2"
    shutil.copytree(trained["model"], model)
    config = LoraConfig(r=4, target_modules=["c_attn"], init_lora_weights=False)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(model), config)
    peft.save_pretrained(model / "adapters" / "only")
    args = ["serve", "--model-dir", str(model), "--host", "127.0.0.1"]
    proc = run_sluice(*args, env={"SAGEMAKER_BIND_TO_PORT": str(free_port())}, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "vLLM cannot apply LoRA adapters to this model" in out and "Traceback" not in out
