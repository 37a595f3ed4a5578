"""`sluice-local plan`: will this fine-tune fit? Memory per GPU for `sluice train` as it runs,
from the model's config alone (the model is built on PyTorch's meta device: no weights, no
download).

What Sluice keeps per GPU (P parameters, T of them trainable, N processes sharing under FSDP):
float32 master weights 4P/N (LoRA without FSDP on a bf16 GPU: the frozen base in bf16, 2(P-T)),
float32 gradients 4T/N, AdamW's two float32 moments 8T/N; under DDP the gradient buckets (4T);
the bf16 weight copies the compute uses (autocast's casts, or FSDP's gathered blocks);
activations for one micro-batch; the logits and their gradient.
Activations are an estimate (the per-layer tensors autograd saves, attention by SDPA without
the s^2 matrix); `benchmarks/train_memory.py` compares the whole estimate with measured peaks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from sluice.errors import SluiceError

GiB = 1 << 30

# SageMaker training instances with GPUs: (GPUs, GiB per GPU, bfloat16). One line per shape;
# the larger sizes of a family add CPU and RAM, not GPUs.
INSTANCES: dict[str, tuple[int, float, bool]] = {
    "ml.g4dn.xlarge": (1, 16, False),  # T4
    "ml.g4dn.12xlarge": (4, 16, False),
    "ml.p3.2xlarge": (1, 16, False),  # V100
    "ml.p3.16xlarge": (8, 16, False),
    "ml.p3dn.24xlarge": (8, 32, False),
    "ml.g5.xlarge": (1, 24, True),  # A10G
    "ml.g5.12xlarge": (4, 24, True),
    "ml.g5.48xlarge": (8, 24, True),
    "ml.g6.xlarge": (1, 24, True),  # L4
    "ml.g6.12xlarge": (4, 24, True),
    "ml.g6.48xlarge": (8, 24, True),
    "ml.g6e.xlarge": (1, 48, True),  # L40S
    "ml.g6e.12xlarge": (4, 48, True),
    "ml.g6e.48xlarge": (8, 48, True),
    "ml.p4d.24xlarge": (8, 40, True),  # A100 40 GB
    "ml.p4de.24xlarge": (8, 80, True),  # A100 80 GB
    "ml.p5.48xlarge": (8, 80, True),  # H100
    "ml.p5e.48xlarge": (8, 141, True),  # H200
    "ml.p5en.48xlarge": (8, 141, True),
}
# what a GPU's memory leaves for tensors: the CUDA context, NCCL buffers and the caching
# allocator's fragmentation take the rest
USABLE = 0.9
RESERVED_GIB = 1.5


@dataclass
class Shape:
    """What the estimate needs from a model: counts from the real module tree on `meta`."""

    parameters: int
    trainable: int
    largest_block: int  # parameters of one transformer block (FSDP gathers one at a time)
    outside_blocks: int  # embeddings, final norm, head (FSDP's root group)
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    architecture: str


@dataclass
class Plan:
    shape: Shape
    method: str
    distributed: str
    processes: int
    batch_size: int
    block_size: int
    activation_checkpointing: bool
    bf16: bool
    parts: dict[str, float] = field(default_factory=dict)  # bytes per GPU

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def load_config(source: str | Path):
    """A transformers config from a model folder or a config.json file."""
    from transformers import AutoConfig

    path = Path(source)
    if path.is_file():
        path = path.parent
    if not (path / "config.json").is_file():
        raise SluiceError(f"no config.json at {source}: give a model folder or its config.json")
    try:
        return AutoConfig.from_pretrained(path)
    except (ValueError, OSError, json.JSONDecodeError) as e:
        raise SluiceError(f"cannot read the model config at {source}: {e}") from None


def model_shape(config, method: str = "full", lora_r: int = 8, lora_targets: str = "") -> Shape:
    """Parameter counts of the model `config` describes (and of its LoRA adapters)."""
    import torch
    from transformers import AutoModelForCausalLM

    from sluice.sharding import layers

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    blocks = layers(model)
    total = sum(p.numel() for p in model.parameters())
    block = max((sum(p.numel() for p in b.parameters()) for b in blocks), default=total)
    outside = total - block * len(blocks)
    trainable = total
    if method == "lora":  # the adapters train adds, from the same code
        from sluice.hyperparameters import TrainConfig
        from sluice.lora import with_lora

        settings = TrainConfig(lora_r=lora_r, lora_target_modules=lora_targets)
        trainable, total = with_lora(model, settings).get_nb_trainable_parameters()
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = getattr(text, "hidden_size", None) or getattr(text, "n_embd", 0)
    return Shape(
        parameters=total,
        trainable=trainable,
        largest_block=block,
        outside_blocks=outside,
        layers=len(blocks) or getattr(text, "num_hidden_layers", 1),
        hidden=hidden,
        intermediate=getattr(text, "intermediate_size", None) or 4 * hidden,
        vocab=text.vocab_size,
        heads=getattr(text, "num_attention_heads", None) or getattr(text, "n_head", 1),
        architecture=type(model).__name__,
    )


def estimate(
    shape: Shape,
    *,
    method: str = "full",
    distributed: str = "ddp",
    processes: int = 1,
    batch_size: int = 1,
    block_size: int = 2048,
    activation_checkpointing: bool = False,
    bf16: bool = True,
    fused_attention: bool = True,
) -> Plan:
    """Bytes per GPU for `train` with these settings (see the module docstring)."""
    plan = Plan(
        shape, method, distributed, processes, batch_size, block_size,
        activation_checkpointing, bf16,
    )  # fmt: skip
    sharded = distributed == "fsdp" and processes > 1
    n = processes if sharded else 1
    p, t = shape.parameters, shape.trainable
    compute = 2 if bf16 else 4
    if method == "lora" and bf16 and not sharded:  # train.py keeps the frozen base in bf16
        plan.parts["frozen weights (bfloat16)"] = 2 * (p - t)
        plan.parts["adapter weights (float32)"] = 4 * t
    else:
        plan.parts["weights (float32)"] = 4 * p / n
    plan.parts["gradients (float32)"] = 4 * t / n
    plan.parts["AdamW moments (float32)"] = 8 * t / n
    if distributed == "ddp" and processes > 1:
        plan.parts["DDP gradient buckets"] = 4 * t
    if sharded:
        # one block in use and the next prefetched, plus the root group (embeddings, head)
        plan.parts["gathered blocks"] = compute * (2 * shape.largest_block + shape.outside_blocks)
    elif bf16:  # autocast's casts of the float32 weights, kept for the backward
        plan.parts["bf16 weight copies"] = 2 * (t if method == "lora" else p)
    tokens = batch_size * block_size
    h, i, n_layers = shape.hidden, shape.intermediate, shape.layers
    # saved for the backward per token and layer: attention inputs/outputs (q, k, v, output,
    # norms: ~10 h) and the MLP's gate, up, activation and product (~4 i)
    per_layer = tokens * (10 * h + 4 * i) * compute
    if not fused_attention:  # PyTorch's math attention (CPU) keeps the s x s probabilities
        per_layer += batch_size * shape.heads * block_size**2 * 4
    if activation_checkpointing:  # each layer's input, and one layer recomputed at a time
        plan.parts["activations"] = n_layers * tokens * h * compute + per_layer
    else:
        plan.parts["activations"] = n_layers * per_layer
    # the backward of a layer holds the gradients of its activations beside them
    plan.parts["backward working set"] = per_layer
    # logits in the compute dtype, upcast to float32 for the loss, and the gradient of that
    plan.parts["logits and loss"] = tokens * shape.vocab * (compute + 8)
    return plan


def usable_bytes(gib_per_gpu: float) -> float:
    return (USABLE * gib_per_gpu - RESERVED_GIB) * GiB


def fitting(shape: Shape, max_instances: int = 16, **settings) -> list[tuple[str, int, Plan]]:
    """For each instance type, the fewest instances (up to max_instances) on which the job fits:
    one for DDP (it does not shard), more for FSDP (each adds GPUs to shard over)."""
    found = []
    for name, (gpus, gib, bf16) in INSTANCES.items():
        counts = range(1, max_instances + 1) if settings.get("distributed") == "fsdp" else [1]
        for count in counts:
            plan = estimate(shape, processes=gpus * count, bf16=bf16, **settings)
            if plan.total <= usable_bytes(gib):
                found.append((name, count, plan))
                break
    return found


def gib(n: float) -> str:
    return f"{n / GiB:,.1f} GiB"


def render(plan: Plan, instance_type: str | None, instance_count: int, fits) -> str:
    """The plan as a short report: the parts per GPU, the verdict, the instance types that fit."""
    s = plan.shape
    lines = [
        f"{s.architecture}: {s.parameters / 1e9:.2f} B parameters, "
        f"{s.trainable / 1e9:.3g} B trainable ({plan.method}), {s.layers} blocks",
        f"{plan.distributed} over {plan.processes} GPU(s), micro-batch {plan.batch_size} x "
        f"{plan.block_size} tokens, activation checkpointing "
        f"{'on' if plan.activation_checkpointing else 'off'}, "
        f"{'bfloat16' if plan.bf16 else 'float32'} compute",
        "",
        "per GPU:",
    ]
    width = max(len(k) for k in plan.parts)
    lines += [f"  {k:<{width}}  {gib(v):>12}" for k, v in plan.parts.items()]
    lines.append(f"  {'total':<{width}}  {gib(plan.total):>12}")
    if instance_type:
        gpus, mem, _ = INSTANCES[instance_type]
        verdict = "fits" if plan.total <= usable_bytes(mem) else "does NOT fit"
        lines += [
            "",
            f"{instance_type} x {instance_count} ({gpus} x {mem:g} GiB GPUs, "
            f"{gib(usable_bytes(mem))} usable each): {verdict}",
        ]
    lines += ["", "instance types on which it fits (fewest instances):"]
    if not fits:
        lines.append("  none up to 16 instances: try finetune_method=lora, distributed=fsdp, "
                     "activation_checkpointing=true or a smaller batch_size")  # fmt: skip
    for name, count, p in fits:
        gpus, mem, _ = INSTANCES[name]
        lines.append(f"  {name} x {count}: {gib(p.total)} of {mem:g} GiB per GPU")
    return "\n".join(lines)


def run(args) -> str:
    """`sluice-local plan`: the report for the command line's settings."""
    if args.instance_type and args.instance_type not in INSTANCES:
        raise SluiceError(
            f"unknown instance type {args.instance_type!r}; known: {', '.join(INSTANCES)}"
        )
    config = load_config(args.model)
    shape = model_shape(config, args.method, args.lora_r, args.lora_target_modules)
    settings = {
        "method": args.method,
        "distributed": args.distributed,
        "batch_size": args.batch_size,
        "block_size": args.block_size,
        "activation_checkpointing": args.activation_checkpointing,
    }
    processes, bf16 = 1, True
    if args.instance_type:
        gpus, _, bf16 = INSTANCES[args.instance_type]
        processes = gpus * args.instance_count
    plan = estimate(shape, processes=processes, bf16=bf16, **settings)
    if args.json:
        return json.dumps(
            {
                "parameters": shape.parameters,
                "trainable": shape.trainable,
                "processes": processes,
                "per_gpu_bytes": {k: math.ceil(v) for k, v in plan.parts.items()},
                "total_bytes": math.ceil(plan.total),
                "fits": [
                    {"instance_type": n, "instance_count": c}
                    for n, c, _ in fitting(shape, **settings)
                ],
            },
            indent=2,
        )
    return render(plan, args.instance_type, args.instance_count, fitting(shape, **settings))


def table(configs: Path, batch_size: int = 1, block_size: int = 2048) -> str:
    """docs/training-memory.md's table: each config under `configs`, full and LoRA, with and
    without FSDP and activation checkpointing (`python -m sluice_local.plan`)."""
    cases = [
        ("full", "ddp", False, "full, DDP"),
        ("full", "fsdp", True, "full, FSDP + act. ckpt"),
        ("lora", "ddp", False, "LoRA r=8"),
        ("lora", "ddp", True, "LoRA r=8 + act. ckpt"),
        ("lora", "fsdp", True, "LoRA r=8, FSDP + act. ckpt"),
    ]
    rows = [
        "| model | method | per GPU (1 GPU; FSDP: 8) | fits on (fewest instances) |",
        "|---|---|---:|---|",
    ]
    for folder in sorted(configs.iterdir(), key=lambda p: (len(p.name), p.name)):
        config = load_config(folder)
        for method, distributed, ckpt, label in cases:
            shape = model_shape(config, method)
            settings = {
                "method": method,
                "distributed": distributed,
                "batch_size": batch_size,
                "block_size": block_size,
                "activation_checkpointing": ckpt,
            }
            processes = 8 if distributed == "fsdp" else 1
            per_gpu = estimate(shape, processes=processes, **settings).total
            fits = fitting(shape, **settings)
            names = ", ".join(
                n.removeprefix("ml.") + (f" x{c}" if c > 1 else "") for n, c, _ in fits[:5]
            )
            if len(fits) > 5:
                names += f", ... ({len(fits)} types)"
            rows.append(
                f"| {folder.name} ({shape.parameters / 1e9:.2f} B) | {label} | "
                f"{gib(per_gpu)} | {names or 'none up to 16 instances'} |"
            )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(Path(__file__).parents[2] / "examples" / "model-configs"))
