"""Hugging Face `Trainer` as the benchmarks' baseline: Sluice's packed blocks as its dataset,
Sluice's optimizer settings, and tokens/s over the steps after `warmup`."""

from __future__ import annotations

import time
from pathlib import Path

import torch


def trainer_tokens_per_s(
    model, blocks, *, batch: int, steps: int, warmup: int, lr: float, warmup_lr: int,
    out: Path, device: str = "cpu",
) -> float:  # fmt: skip
    """Train `model` on `blocks` (a sluice.data.PackedBlocks) with `Trainer` for `steps` steps;
    tokens/s of the steps after the first `warmup`."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Blocks(torch.utils.data.Dataset):
        def __len__(self):
            return len(blocks)

        def __getitem__(self, i):
            x = torch.from_numpy(blocks.block(i))
            return {"input_ids": x, "labels": x}

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=batch,
        max_steps=steps,
        learning_rate=lr,
        warmup_steps=warmup_lr,
        weight_decay=0.1,
        adam_beta2=0.95,
        lr_scheduler_type="cosine",
        max_grad_norm=1.0,
        logging_steps=steps,
        save_strategy="no",
        report_to="none",
        use_cpu=device == "cpu",
        dataloader_num_workers=0,
        disable_tqdm=True,
        bf16=device.startswith("cuda"),
        seed=0,
    )
    Trainer(model=model, args=args, train_dataset=Blocks(), callbacks=[Clock()]).train()
    return (len(stamps) - warmup) * batch * blocks.block_size / (stamps[-1] - stamps[warmup - 1])
