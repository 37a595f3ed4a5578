"""LoRA fine-tuning through PEFT: low-rank adapters on a frozen base, merged into plain weights
when the model is published (serving, export and monitoring see an ordinary checkpoint)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from .errors import SluiceError
from .hyperparameters import TrainConfig

log = logging.getLogger("sluice.lora")


def with_lora(model, cfg: TrainConfig, start: Path | None = None):
    """`model` with LoRA adapters (the base frozen); PEFT picks the target modules for known
    architectures unless `lora_target_modules` names them. With `start` (an adapter folder of
    this base) that adapter is trained further: its rank and modules, not cfg's."""
    from peft import LoraConfig, PeftModel, get_peft_model

    if start is not None:
        adapted = PeftModel.from_pretrained(model, str(start), is_trainable=True)
        config = adapted.peft_config["default"]
        log.info("LoRA: training the adapter %s further (rank %d)", start, config.r)
        return adapted

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


ADAPTERS_DIR = "adapters"
ADAPTER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # what a record's `adapter` can name


def named_adapters(model_dir: Path) -> dict[str, Path]:
    """The named LoRA adapters a model artifact carries: `adapters/<name>/`, each a PEFT
    adapter folder (adapter_config.json and its weights), for records to pick by name."""
    root = Path(model_dir) / ADAPTERS_DIR
    if not root.is_dir():
        return {}
    found = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        if not ADAPTER_NAME.fullmatch(d.name):
            raise SluiceError(
                f"{d}: an adapter's folder name is its name in records: 1-64 of A-Z a-z 0-9 _ . -"
            )
        if not (d / "adapter_config.json").is_file():
            raise SluiceError(f"{d}: no adapter_config.json (save adapters with PEFT)")
        found[d.name] = d
    return found


def identity_adapter(like: Path, out: Path) -> Path:
    """An adapter shaped like `like` with all weights zero: it changes nothing.

    vLLM 0.32's CPU build applies the wrong adapter to a record without one when records with
    adapters share its batch (measured: a base record got another record's adapter); the base
    records of a multi-adapter model run with this one instead, so every record has its own.
    """
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy(like / "adapter_config.json", out / "adapter_config.json")
    weights = like / "adapter_model.safetensors"
    if weights.is_file():
        save_file(
            {k: torch.zeros_like(v) for k, v in load_file(weights).items()}, out / weights.name
        )
    else:  # PEFT's older format
        state = torch.load(like / "adapter_model.bin", map_location="cpu", weights_only=True)
        torch.save({k: torch.zeros_like(v) for k, v in state.items()}, out / "adapter_model.bin")
    return out
