"""`sluice-local plan`: parameter counts from the real module tree on `meta`, the per-GPU
arithmetic, and the instance types it names (benchmarks/train_llama.py checks the estimate
against measured peaks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from sluice_local import plan
from sluice_local.cli import main

CONFIGS = Path(__file__).parents[2] / "examples" / "model-configs"


def tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=500, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip


def test_counts_match_the_real_model_and_peft():
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    config = tiny_llama_config()
    real = LlamaForCausalLM(config)
    shape = plan.model_shape(config)
    assert shape.parameters == sum(p.numel() for p in real.parameters())
    assert shape.layers == 3 and shape.hidden == 64 and shape.vocab == 500
    block = sum(p.numel() for p in real.model.layers[0].parameters())
    assert shape.largest_block == block
    assert shape.outside_blocks == shape.parameters - 3 * block

    lora = plan.model_shape(config, "lora", lora_r=4)
    adapted = get_peft_model(real, LoraConfig(task_type="CAUSAL_LM", r=4))
    assert lora.trainable == adapted.get_nb_trainable_parameters()[0]


def test_full_ddp_fsdp_and_lora_arithmetic():
    shape = plan.model_shape(tiny_llama_config())
    p = shape.parameters
    one = plan.estimate(shape, processes=1, bf16=False, batch_size=2, block_size=8)
    assert one.parts["weights (float32)"] == 4 * p
    assert one.parts["gradients (float32)"] == 4 * p
    assert one.parts["AdamW moments (float32)"] == 8 * p
    assert "bf16 weight copies" not in one.parts

    fsdp = plan.estimate(shape, distributed="fsdp", processes=8, batch_size=2, block_size=8)
    assert fsdp.parts["AdamW moments (float32)"] == 8 * p / 8
    assert (
        fsdp.parts["activations"]
        == plan.estimate(shape, batch_size=2, block_size=8).parts["activations"]
    )
    checkpointed = plan.estimate(shape, batch_size=2, block_size=8, activation_checkpointing=True)
    assert checkpointed.parts["activations"] < one.parts["activations"] / 2

    lora = plan.model_shape(tiny_llama_config(), "lora")
    gpu = plan.estimate(lora, method="lora", bf16=True)
    assert gpu.parts["frozen weights (bfloat16)"] == 2 * (lora.parameters - lora.trainable)
    assert gpu.parts["AdamW moments (float32)"] == 8 * lora.trainable


def test_an_8b_llama_full_fine_tune_needs_fsdp_and_lora_fits_one_a10g():
    shape = plan.model_shape(plan.load_config(CONFIGS / "llama-8b"))
    assert shape.parameters == pytest.approx(8.03e9, rel=0.001)
    assert plan.fitting(shape, method="full", distributed="ddp") == []
    fsdp = {n: c for n, c, _ in plan.fitting(shape, method="full", distributed="fsdp")}
    assert fsdp["ml.p4de.24xlarge"] == 1
    lora = plan.model_shape(plan.load_config(CONFIGS / "llama-8b"), "lora")
    fits = {n for n, _, _ in plan.fitting(lora, method="lora", activation_checkpointing=True)}
    assert "ml.g5.xlarge" in fits and "ml.g4dn.xlarge" not in fits  # T4: no bf16, 16 GiB


def test_the_command_line(capsys, tmp_path):
    assert main(["plan", "--model", str(CONFIGS / "llama-1b"), "--instance-type",
                 "ml.g5.12xlarge", "--method", "lora", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["processes"] == 4 and out["parameters"] == pytest.approx(1.236e9, rel=0.001)
    assert {"instance_type": "ml.g5.xlarge", "instance_count": 1} in out["fits"]
    assert main(["plan", "--model", str(tmp_path)]) == 1  # no config.json: one line, exit 1
    assert "no config.json" in "".join(capsys.readouterr())  # the log goes to stdout
    assert main(["plan", "--model", str(CONFIGS / "llama-1b"), "--instance-type", "ml.x"]) == 1


def test_lora_keeps_the_frozen_base_in_bf16_and_trains_float32_adapters():
    """What train does on a bf16 GPU, run here with CPU autocast: half the base's memory, the
    adapters still learn in float32, and merging gives plain bf16 weights."""
    from transformers import LlamaForCausalLM

    from sluice.hyperparameters import TrainConfig
    from sluice.lora import store_frozen, with_lora

    torch.manual_seed(0)
    base = LlamaForCausalLM(tiny_llama_config())
    q_before = base.model.layers[0].self_attn.q_proj.weight.detach().clone()
    model = with_lora(base, TrainConfig(lora_r=4))
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    assert store_frozen(model, torch.bfloat16) == 2 * frozen
    dtypes = {p.dtype for p in model.parameters() if p.requires_grad}
    assert dtypes == {torch.float32}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
    x = torch.randint(0, 500, (2, 16))
    for _ in range(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert torch.isfinite(loss)
    merged = model.merge_and_unload()
    q = merged.model.layers[0].self_attn.q_proj.weight
    assert q.dtype == torch.bfloat16
    assert not torch.equal(q.float(), q_before.bfloat16().float())


def test_the_docs_table_is_what_the_plan_prints():
    docs = (Path(__file__).parents[2] / "docs" / "training-memory.md").read_text()
    assert plan.table(CONFIGS) in docs
