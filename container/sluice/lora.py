"""LoRA fine-tuning through PEFT: low-rank adapters on a frozen base, merged into plain weights
when the model is published (serving, export and monitoring see an ordinary checkpoint)."""

from __future__ import annotations

import logging
from pathlib import Path

from .errors import SluiceError
from .hyperparameters import TrainConfig

log = logging.getLogger("sluice.lora")


def with_lora(model, cfg: TrainConfig):
    """`model` with LoRA adapters (the base frozen); PEFT picks the target modules for known
    architectures unless `lora_target_modules` names them."""
    from peft import LoraConfig, get_peft_model

    targets = [t.strip() for t in cfg.lora_target_modules.split(",") if t.strip()] or None
    config = LoraConfig(
        task_type="CAUSAL_LM",
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
    )
    try:
        adapted = get_peft_model(model, config)
    except ValueError as e:
        raise SluiceError(
            f"LoRA cannot adapt this model ({e}); name its linear layers with lora_target_modules"
        ) from None
    trainable, total = adapted.get_nb_trainable_parameters()
    log.info(
        "LoRA rank %d (alpha %d) on %s: %s of %s parameters trainable (%.2f %%)",
        cfg.lora_r,
        cfg.lora_alpha,
        ", ".join(sorted(adapted.peft_config["default"].target_modules)),
        f"{trainable:,}",
        f"{total:,}",
        100 * trainable / total,
    )
    return adapted


def store_frozen(model, dtype) -> int:
    """Keep the frozen base in `dtype` (bf16 on GPUs): it takes no optimizer step, so float32
    master copies of it would only double its memory, and autocast would cast it again for
    every step. The adapters stay float32. Returns the bytes saved."""
    saved = 0
    for p in model.parameters():
        if not p.requires_grad and p.dtype != dtype and p.is_floating_point():
            saved += p.numel() * (p.element_size() - dtype.itemsize)
            p.data = p.data.to(dtype)
    return saved


def is_lora(model) -> bool:
    return hasattr(model, "merge_and_unload") and hasattr(model, "peft_config")


ADAPTER_DIR = "adapter"


def publishable(model, staging: Path, merge: bool = True):
    """The model to save and what sluice.json records of it. A LoRA model's adapter goes to
    `staging/adapter` (small, for whoever serves adapters); its weights are merged into the base,
    or with merge=False the base is saved untouched and the adapter stays the only copy of what
    training learned (sluice.json: {"lora": {"adapter": "adapter", "merged": false}})."""
    if not is_lora(model):
        return model, {}
    model.save_pretrained(staging / ADAPTER_DIR)
    config = model.peft_config["default"]
    info = {"adapter": ADAPTER_DIR, "merged": merge, "r": config.r, "alpha": config.lora_alpha}
    return (model.merge_and_unload() if merge else model.unload()), {"lora": info}


def unmerged_adapter(model_dir: Path, info: dict) -> Path | None:
    """The adapter folder of a model published with lora_merge=false (`info`: its sluice.json)."""
    lora = info.get("lora") or {}
    if lora.get("merged", True):
        return None
    path = Path(model_dir) / lora.get("adapter", ADAPTER_DIR)
    if not (path / "adapter_config.json").is_file():
        raise SluiceError(
            f"{model_dir}: sluice.json names an unmerged LoRA adapter, but {path.name}/ holds no "
            "adapter_config.json: the model is incomplete, publish it again"
        )
    return path


def merge_adapter(model, adapter: Path):
    """`model` (the base) with the adapter's weights merged in: plain weights for the jobs that
    do not apply adapters themselves (evaluation, export, monitoring, torch scoring)."""
    from peft import PeftModel

    log.info("merging the LoRA adapter %s into the base weights", adapter)
    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
