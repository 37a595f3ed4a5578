"""Training hyperparameters: SageMaker passes every value as a string; parse and validate them here.

One dataclass is the whole contract: its fields, types, defaults and docs are what `sluice train
--help` lists and what the retraining state machine may override.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from .errors import SluiceError

TRUE = {"true", "1", "yes", "on"}
FALSE = {"false", "0", "no", "off"}


def _doc(text: str, **kw: Any) -> Any:
    return field(metadata={"doc": text}, **kw)


@dataclass
class TrainConfig:
    """Every training hyperparameter, with its default."""

    # model
    model_size: str = _doc(
        "size preset when training from scratch: tiny, small or base", default="small"
    )
    n_layer: int | None = _doc("override the preset's number of layers", default=None)
    n_head: int | None = _doc("override the preset's attention heads", default=None)
    n_embd: int | None = _doc("override the preset's hidden size", default=None)
    n_positions: int | None = _doc("override the preset's context length", default=None)
    vocab_size: int | None = _doc("override the preset's BPE vocabulary size", default=None)
    dropout: float = _doc("dropout on residual, embedding and attention", default=0.0)
    model_id: str = _doc(
        "fine-tune this Hugging Face model id (cloud only; or use a `pretrained` channel)",
        default="",
    )
    finetune_method: str = _doc(
        "full (every weight) or lora (low-rank adapters through PEFT, merged into the published "
        "model unless lora_merge=false)",
        default="full",
    )
    lora_merge: bool = _doc(
        "LoRA: publish plain merged weights (true), or the untouched base weights with the "
        "adapter beside them in adapter/ (false): serve applies the adapter through vLLM's LoRA "
        "support, every other job merges it when it loads the model",
        default=True,
    )
    lora_base: str = _doc(
        "lora_merge=false: publish a copy of the base beside the adapter (copy), or only the "
        "adapter, its sluice.json naming the base's S3 artifact (reference: pretrained_s3_uri or "
        "baseline_s3_uri, checked by ETag), fetched by every job that loads the model",
        default="copy",
    )
    pretrained_s3_uri: str = _doc(
        "the S3 URI the `pretrained` channel was filled from (for lora_base=reference)",
        default="",
    )
    baseline_s3_uri: str = _doc(
        "the S3 URI the `baseline` channel was filled from (the retraining state machine sets "
        "it: the champion's ModelDataUrl)",
        default="",
    )
    lora_r: int = _doc("LoRA rank", default=8)
    lora_alpha: int = _doc("LoRA scaling numerator (scale = lora_alpha / lora_r)", default=16)
    lora_dropout: float = _doc("dropout on the LoRA path", default=0.05)
    lora_target_modules: str = _doc(
        "comma-separated module names to adapt (empty: PEFT's default for the architecture, "
        "e.g. q_proj,v_proj for Llama, c_attn for GPT-2)",
        default="",
    )
    # data
    text_field: str = _doc("JSON Lines field holding the text", default="text")
    text_column: str = _doc("CSV column holding the text", default="text")
    txt_mode: str = _doc(
        "plain text files: `line` (one record a line) or `document` (one a file)", default="line"
    )
    min_chars: int = _doc("drop records shorter than this after cleaning", default=1)
    max_chars: int = _doc("drop records longer than this (0: no limit)", default=0)
    validation_fraction: float = _doc(
        "held-out share when there is no validation channel", default=0.05
    )
    block_size: int = _doc("tokens per training block (at most the context length)", default=128)
    # optimisation
    batch_size: int = _doc("blocks per device per micro-step", default=16)
    grad_accum: int = _doc("micro-steps per optimizer step", default=1)
    learning_rate: float = _doc("peak learning rate", default=3e-4)
    min_lr_ratio: float = _doc("final learning rate as a fraction of the peak", default=0.1)
    lr_schedule: str = _doc("decay after warmup: cosine or linear", default="cosine")
    warmup_steps: int = _doc("linear warmup steps", default=50)
    weight_decay: float = _doc("AdamW weight decay (not on biases and norms)", default=0.1)
    beta1: float = _doc("AdamW beta1", default=0.9)
    beta2: float = _doc("AdamW beta2", default=0.95)
    grad_clip: float = _doc("clip the gradient norm to this (0: off)", default=1.0)
    epochs: float = _doc("passes over the training blocks (used when max_steps is 0)", default=1.0)
    max_steps: int = _doc("optimizer steps; overrides epochs when > 0", default=0)
    seed: int = _doc("seed for data order, initialisation and dropout", default=1234)
    precision: str = _doc(
        "auto (bf16 or fp16 on GPU, fp32 on CPU), fp32, bf16 or fp16", default="auto"
    )
    activation_checkpointing: bool = _doc(
        "recompute each layer's activations in the backward pass: far less activation memory "
        "for about a third more compute",
        default=False,
    )
    distributed: str = _doc(
        "with several processes: ddp (every GPU holds the whole model, gradients and AdamW "
        "state) or fsdp (each holds 1/N of them: models that do not fit one GPU); fsdp "
        "checkpoints are sharded and resume on any number of processes",
        default="ddp",
    )
    # bookkeeping
    log_interval: int = _doc("steps between training log lines", default=10)
    eval_interval: int = _doc("steps between validation estimates (0: only at the end)", default=0)
    eval_batches: int = _doc("batches per periodic validation estimate", default=20)
    checkpoint_interval: int = _doc("steps between checkpoints (0: only on SIGTERM)", default=200)
    keep_checkpoints: int = _doc("checkpoints kept on disk", default=2)
    eval_max_records: int = _doc("cap on held-out records scored at the end (0: all)", default=0)
    export_edge: bool = _doc(
        "write the TorchScript/ONNX edge export into the artifacts", default=True
    )
    edge_seq_len: int = _doc("fixed sequence length of the edge export", default=128)
    loss_curve: bool = _doc("write loss_curve.png next to the model", default=True)
    warm_start: bool = _doc(
        "fine-tune the champion (channel `baseline`) when no `pretrained` channel is given",
        default=False,
    )
    artifacts_s3_uri: str = _doc(
        "S3 prefix that receives evaluation.json and the edge export as plain objects (the "
        "retraining state machine registers and compiles them from there)",
        default="",
    )
    # serving defaults recorded in sluice.json
    default_task: str = _doc(
        "task a record gets when it names none: generate, score, next_token", default="generate"
    )
    max_new_tokens: int = _doc("default generation length", default=32)

    @classmethod
    def field_docs(cls) -> dict[str, tuple[str, Any]]:
        return {f.name: (f.metadata.get("doc", ""), f.default) for f in fields(cls)}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


CHOICES = {
    "finetune_method": ("full", "lora"),
    "lora_base": ("copy", "reference"),
    "distributed": ("ddp", "fsdp"),
    "model_size": ("tiny", "small", "base"),
    "txt_mode": ("line", "document"),
    "lr_schedule": ("cosine", "linear"),
    "precision": ("auto", "fp32", "bf16", "fp16"),
    "default_task": ("generate", "score", "next_token"),
}
# blocks per device per micro-step: far above what any accelerator holds (larger effective
# batches come from grad_accum and more devices)
MAX_BATCH = 1 << 16
POSITIVE = {
    "lora_r",
    "lora_alpha",
    "batch_size",
    "grad_accum",
    "block_size",
    "log_interval",
    "keep_checkpoints",
    "edge_seq_len",
}


def _parse_value(name: str, raw: Any, typ: Any) -> Any:
    text = raw if isinstance(raw, str) else json.dumps(raw)
    text = text.strip()
    optional = typ in (int | None, float | None)
    if optional and text.lower() in ("", "none", "null"):
        return None
    base = int if typ in (int, int | None) else float if typ in (float, float | None) else typ
    try:
        if base is bool:
            if text.lower() in TRUE:
                return True
            if text.lower() in FALSE:
                return False
            raise ValueError
        if base is int:
            value = float(text)
            if value != int(value):
                raise ValueError
            return int(value)
        if base is float:
            return float(text)
        return text
    except (ValueError, OverflowError):  # int(float("inf")) overflows
        kind = {bool: "true or false", int: "an integer", float: "a number"}[base]
        raise SluiceError(f"hyperparameter {name}={raw!r} is not {kind}") from None


def parse_hyperparameters(raw: dict[str, Any]) -> TrainConfig:
    """Build a TrainConfig from SageMaker-style string values; unknown names are an error.

    Names starting with `sagemaker_` or `_` belong to SageMaker's tooling and are ignored.
    """
    hints = get_type_hints(TrainConfig)
    known = {f.name for f in fields(TrainConfig)}
    values: dict[str, Any] = {}
    for name, value in raw.items():
        if name.startswith(("sagemaker_", "_")):
            continue
        key = name.replace("-", "_")
        if key not in known:
            raise SluiceError(
                f"unknown hyperparameter {name!r}; see `sluice train --help` for the list"
            )
        values[key] = _parse_value(name, value, hints[key])
    cfg = TrainConfig(**values)
    for name, allowed in CHOICES.items():
        if getattr(cfg, name) not in allowed:
            raise SluiceError(
                f"hyperparameter {name}={getattr(cfg, name)!r}: choose one of {allowed}"
            )
    for name in POSITIVE:
        if getattr(cfg, name) <= 0:
            raise SluiceError(f"hyperparameter {name} must be positive, got {getattr(cfg, name)}")
    for name in ("batch_size", "grad_accum"):
        if getattr(cfg, name) > MAX_BATCH:
            raise SluiceError(
                f"hyperparameter {name}={getattr(cfg, name)} is more than {MAX_BATCH}; "
                "batch_size is blocks per device per micro-step (typically 1-64), grad_accum "
                "micro-steps per update: make the batch larger with grad_accum and devices"
            )
    if not 0.0 <= cfg.validation_fraction < 1.0:
        raise SluiceError("hyperparameter validation_fraction must be in [0, 1)")
    if not math.isfinite(cfg.learning_rate) or cfg.learning_rate <= 0:
        lr = cfg.learning_rate
        raise SluiceError(
            f"hyperparameter learning_rate must be a positive finite number, not {lr}"
        )
    if cfg.max_steps <= 0 and cfg.epochs <= 0:
        raise SluiceError("set max_steps or epochs to a positive value")
    if cfg.lora_base == "reference" and (cfg.finetune_method != "lora" or cfg.lora_merge):
        raise SluiceError(
            "lora_base=reference publishes an adapter without its base: it needs "
            "finetune_method=lora and lora_merge=false"
        )
    return cfg


TUNING_MARK = "_tuning_objective_metric"  # SageMaker adds it to every tuning job's trial


def for_trial(raw: dict[str, str], checkpoint_dir: Path, env: dict[str, str]) -> dict[str, str]:
    """A trial of a hyperparameter tuning job shares its definition with every other trial:
    the same `artifacts_s3_uri` and CheckpointConfig. Its own artifacts and checkpoints go one
    level down, under its job name (SageMaker's framework containers do the same with
    model_dir), so trials never overwrite each other's evaluation or resume from another's
    checkpoint. `env` gets the trial's SM_CHECKPOINT_DIR (torchrun's workers inherit it)."""
    job = env.get("TRAINING_JOB_NAME", "")
    if TUNING_MARK not in raw or not job:
        return raw
    out = dict(raw)
    if out.get("artifacts_s3_uri"):
        out["artifacts_s3_uri"] = out["artifacts_s3_uri"].rstrip("/") + f"/{job}/"
    if checkpoint_dir.name != job:
        env["SM_CHECKPOINT_DIR"] = str(checkpoint_dir / job)
    return out
