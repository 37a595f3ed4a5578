"""The `train` command: from scratch (BPE tokenizer + GPT-2 config) or fine-tune, SageMaker-style.

Reads /opt/ml/input (hyperparameters, channels `train`, optional `validation`, `baseline`,
`pretrained`), writes the model in save_pretrained layout to /opt/ml/model, evaluation.json to the
model and /opt/ml/output/data, and checkpoints to /opt/ml/checkpoints. Runs under torchrun for
several GPUs or instances; only rank 0 writes artifacts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from . import __version__, checkpoint, sharding
from .base_ref import describe, reference, strip_weights
from .data import PackedBlocks, pack_tokens, prepare_text, read_lines
from .distributed import Ranks
from .errors import SluiceError
from .evaluate import evaluate_model, evaluation_report
from .hyperparameters import TrainConfig
from .lora import publishable, store_frozen, unmerged_adapter, with_lora
from .metrics import metric_line, strict_json
from .model import (
    build_scratch_model,
    context_length,
    ensure_pad_token,
    fit_embeddings,
    load_model,
    parameter_count,
    read_sluice_json,
    size_config,
    unpack_model_source,
    write_sluice_json,
)
from .paths import OptML
from .tokenizer import train_bpe

log = logging.getLogger("sluice.train")


@dataclass
class StopFlag:
    """Set by SIGTERM (spot interruption, StopTrainingJob): checkpoint and exit at the next step."""

    requested: bool = False
    stop_after_step: int = 0  # testing hook: behave as if SIGTERM arrived after this step

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        log.warning("SIGTERM received: checkpointing and stopping after this step")
        self.requested = True


class Interrupted(Exception):
    """Training stopped on SIGTERM after writing a checkpoint; the job will resume from it."""


@dataclass
class History:
    train: list[tuple[int, float]] = field(default_factory=list)
    validation: list[tuple[int, float]] = field(default_factory=list)


def precision_for(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: bf16 where supported, else fp16 (with a scaler); None means fp32."""
    if device.type != "cuda" or cfg.precision == "fp32":
        return None
    if cfg.precision == "bf16" or (cfg.precision == "auto" and torch.cuda.is_bf16_supported()):
        return torch.bfloat16
    return torch.float16


def precision_text(
    stored: torch.dtype, amp: torch.dtype | None, frozen: torch.dtype | None = None
) -> str:
    """What the log says about precision: the weights trained, the checkpoint's, the compute;
    `frozen`: the dtype LoRA's frozen base is kept in, when not float32."""
    name = str(stored).removeprefix("torch.")
    weights = "float32 weights"
    if name != "float32":
        weights += f" (the checkpoint's {name}, upcast)"
    if frozen is not None:
        weights = f"float32 LoRA adapters on a {str(frozen).removeprefix('torch.')} frozen base"
    compute = f"{str(amp).removeprefix('torch.')} autocast" if amp else "float32"
    return f"{weights}, {compute} compute"


def lr_factor(step: int, cfg: TrainConfig, total: int) -> float:
    """Linear warmup, then cosine or linear decay to min_lr_ratio of the peak."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    if cfg.lr_schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        decay = 1.0 - progress
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * decay


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device):
    """AdamW with weight decay on matrices only (not biases, norms, or 1-d parameters)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = device.type == "cuda"
    return torch.optim.AdamW(
        groups, lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), fused=fused
    )


@dataclass
class Source:
    """What training starts from: the model to fine-tune (None: from scratch) and its name; with
    lora_base=reference also the base the published adapter will name, and the source's own
    unmerged adapter (trained further, so the new one stays an adapter of that same base)."""

    loaded: tuple | None = None  # (model, tokenizer)
    name: str | None = None
    base: dict | None = None
    adapter: Path | None = None


def _load_source(opt: OptML, cfg: TrainConfig, work: Path) -> Source:
    """The pretrained model to fine-tune (channel `pretrained`, the champion, or model_id)."""
    channel = opt.channel("pretrained")
    if channel.exists() and any(channel.iterdir()):
        folder = unpack_model_source(channel, work)
        return _from_artifact(folder, str(channel), "pretrained", cfg.pretrained_s3_uri, cfg)
    baseline = opt.channel("baseline")
    if cfg.warm_start and baseline.exists() and any(baseline.iterdir()):
        folder = unpack_model_source(baseline, work / "warm-start")
        return _from_artifact(folder, "champion", "baseline", cfg.baseline_s3_uri, cfg)
    if cfg.lora_base == "reference":
        raise SluiceError(
            "lora_base=reference names the base's S3 artifact: give it as the `pretrained` "
            "channel (with pretrained_s3_uri) or warm_start from the `baseline` channel"
        )
    if cfg.model_id:
        try:
            return Source(load_model(cfg.model_id), cfg.model_id)
        except SluiceError as e:
            raise SluiceError(
                f"cannot load model_id {cfg.model_id!r} from the Hugging Face Hub ({e}); "
                "without Hub access give the model as a `pretrained` channel"
            ) from None
    return Source()


def _from_artifact(folder: Path, name: str, channel: str, uri: str, cfg: TrainConfig) -> Source:
    if cfg.lora_base != "reference":
        return Source(load_model(folder), name)
    # a source that names its base passes it on; otherwise the source's own artifact is the base
    base = reference(folder)
    if base is None:
        if not uri:
            raise SluiceError(
                f"lora_base=reference names the base's S3 artifact: set {channel}_s3_uri to the "
                f"URI the `{channel}` channel was filled from"
            )
        base = describe(uri)
    adapter = unmerged_adapter(folder, read_sluice_json(folder))
    if adapter is not None:
        log.info("lora_base=reference: training the source's own adapter further on its base")
    return Source(load_model(folder, merge=False), name, base, adapter)


def prepare(opt: OptML, cfg: TrainConfig, ranks: Ranks):
    """Clean, split, tokenise and pack; the first process on each node does it, others wait."""
    work = opt.work_dir
    ckpt_tok = opt.checkpoint_dir / "tokenizer"
    train_ch = opt.channel("train")
    val_ch = opt.channel("validation")
    val_ch = val_ch if val_ch.exists() and any(val_ch.rglob("*")) else None
    work.mkdir(parents=True, exist_ok=True)
    # the model first: a wrong pretrained model fails before minutes of data preparation
    source = _load_source(opt, cfg, work)
    if ranks.local_rank == 0:
        text = prepare_text(train_ch, val_ch, cfg, work)
        (work / "data.json").write_text(json.dumps(text.stats))
    ranks.barrier()
    stats = json.loads((work / "data.json").read_text())
    if source.loaded is not None:
        model, tokenizer = source.loaded
        if fit_embeddings(model, tokenizer) and source.base is not None:
            raise SluiceError(
                "lora_base=reference: the embedding had to grow for the tokenizer, so the base "
                "in S3 is not what the adapter applies to: use lora_base=copy"
            )
    else:
        if ranks.local_rank == 0 and not (work / "tokenizer" / "tokenizer.json").exists():
            if (ckpt_tok / "tokenizer.json").exists():
                # resuming: the tokenizer the checkpoints were trained with, not a new one
                shutil.copytree(ckpt_tok, work / "tokenizer", dirs_exist_ok=True)
            else:
                vocab = size_config(cfg)["vocab_size"]
                tok = train_bpe(read_lines(work / "train.txt"), vocab)
                tok.save_pretrained(work / "tokenizer")
        ranks.barrier()
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
        ensure_pad_token(tokenizer)
        model = None
    if ranks.is_main and source.loaded is None:
        shutil.copytree(work / "tokenizer", ckpt_tok, dirs_exist_ok=True)
    if ranks.local_rank == 0:
        for split in ("train", "validation"):
            pack_tokens(
                read_lines(work / f"{split}.txt"),
                tokenizer,
                work / f"{split}.bin",
                tokenizer.eos_token_id,
            )
    ranks.barrier()
    return model, tokenizer, source, stats


def batch_indices(order: np.ndarray, base: int, n: int) -> np.ndarray:
    return order[np.arange(base, base + n) % len(order)]


def run_training(
    opt: OptML, cfg: TrainConfig, progress: bool = False, stop: StopFlag | None = None
) -> dict:
    """Train, evaluate and write artifacts. Returns the evaluation report (on rank 0)."""
    ranks = Ranks.from_env()
    ranks.init()
    device = ranks.device()
    stop = stop or StopFlag()
    stop.install()
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)

    model, tokenizer, source, stats = prepare(opt, cfg, ranks)
    named_base, adapter, source = source.base, source.adapter, source.name
    mode = "finetune" if model is not None else "scratch"
    if model is None:
        torch.manual_seed(cfg.seed)
        model = build_scratch_model(cfg, tokenizer)
    block = min(cfg.block_size, context_length(model.config))
    train_blocks = PackedBlocks(opt.work_dir / "train.bin", block, len(tokenizer))
    val_blocks = PackedBlocks(opt.work_dir / "validation.bin", block, len(tokenizer))
    if len(train_blocks) == 0:
        raise SluiceError(
            f"training data is {len(train_blocks.tokens)} tokens, less than one block of {block}: "
            "add data or lower block_size"
        )
    stored_dtype = next(model.parameters()).dtype
    config = model.config
    # fp32 master weights whatever the checkpoint holds: AdamW steps on bf16 weights lose most
    # small updates; bf16 compute comes from autocast where the device has it
    model.float().to(device)
    if cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.finetune_method == "lora":
        if mode != "finetune":
            raise SluiceError(
                "finetune_method=lora adapts an existing model: give a `pretrained` channel, "
                "model_id, or warm_start with a `baseline` channel"
            )
        model = with_lora(model, cfg, start=adapter)
    raw_model = model
    amp_dtype = precision_for(cfg, device)
    fsdp = ranks.distributed and cfg.distributed == "fsdp"
    frozen_dtype = None
    if cfg.finetune_method == "lora" and amp_dtype == torch.bfloat16 and not fsdp:
        saved, frozen_dtype = store_frozen(model, amp_dtype), amp_dtype
        log.info("LoRA: the frozen base kept in bfloat16 (%.2f GiB less)", saved / 2**30)
    if fsdp:
        if amp_dtype == torch.float16:  # fp16 needs a loss scaler FSDP's float32 reduce lacks
            log.warning("distributed=fsdp on a GPU without bfloat16: float32 compute")
            amp_dtype = None
        sharding.shard(model, amp_dtype)
    elif ranks.distributed:
        model = DDP(model, device_ids=[ranks.local_rank] if device.type == "cuda" else None)
    scaler = torch.amp.GradScaler("cuda", enabled=amp_dtype == torch.float16)
    autocast = (
        torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
    )
    optimizer = make_optimizer(raw_model, cfg, device)

    per_step = cfg.batch_size * cfg.grad_accum * ranks.world_size
    steps_per_epoch = max(1, len(train_blocks) // per_step)
    total = cfg.max_steps if cfg.max_steps > 0 else max(1, math.ceil(cfg.epochs * steps_per_epoch))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg, total))
    history = History()
    step = 0

    resumed = checkpoint.latest(opt.checkpoint_dir)
    if resumed is not None and resumed.get("fingerprint") != stats["train"]["fingerprint"]:
        log.warning("checkpoint is for other training data; starting afresh")
        resumed = None
    if resumed is not None:
        if "sharded" in resumed:
            checkpoint.load_sharded(resumed["sharded"], raw_model, optimizer)
        elif fsdp:
            raise SluiceError(
                "the checkpoints were written with distributed=ddp: resume with distributed=ddp, "
                "or start afresh without them"
            )
        else:
            raw_model.load_state_dict(resumed["model"])
            optimizer.load_state_dict(resumed["optimizer"])
        scheduler.load_state_dict(resumed["scheduler"])
        scaler.load_state_dict(resumed["scaler"])
        history = History(**resumed["history"])
        step = resumed["step"]
        checkpoint.set_rng_state(resumed["rng"])
        log.info("resumed from checkpoint at step %d of %d", step, total)

    if ranks.is_main:
        log.info(
            "training %s model: %s parameters, %d train blocks of %d tokens, %d steps, device %s, "
            "world size %d, precision: %s",
            mode,
            f"{parameter_count(raw_model):,}",
            len(train_blocks),
            block,
            total,
            device,
            ranks.world_size,
            precision_text(stored_dtype, amp_dtype, frozen_dtype),
        )

    def save_checkpoint() -> None:
        trainer = {
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(),
            "history": history.__dict__,
            "fingerprint": stats["train"]["fingerprint"],
        }
        if cfg.distributed == "fsdp":  # sharded, so that it resumes on any process count
            checkpoint.save_sharded(
                opt.checkpoint_dir, step, raw_model, optimizer, trainer, cfg.keep_checkpoints, ranks
            )
            return
        if ranks.is_main:
            state = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict()}
            checkpoint.save(opt.checkpoint_dir, step, {**state, **trainer}, cfg.keep_checkpoints)
        ranks.barrier()

    bar = None
    if progress and ranks.is_main:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=step, unit="step", dynamic_ncols=True)
    model.train()
    orders: dict[int, np.ndarray] = {}
    interval_loss, interval_n, interval_t = 0.0, 0, time.perf_counter()
    tokens_per_step = per_step * block
    while step < total:
        epoch, within = divmod(step, steps_per_epoch)
        if epoch not in orders:
            orders = {epoch: train_blocks.order(cfg.seed, epoch)}
        base = within * per_step
        step_loss = 0.0
        for micro in range(cfg.grad_accum):
            start = base + (micro * ranks.world_size + ranks.rank) * cfg.batch_size
            idx = batch_indices(orders[epoch], start, cfg.batch_size)
            x = torch.from_numpy(np.stack([train_blocks.block(i) for i in idx])).to(device)
            sync = micro == cfg.grad_accum - 1
            ctx = contextlib.nullcontext()
            if fsdp:
                sharding.gradient_sync(model, sync)
            elif ranks.distributed and not sync:
                ctx = model.no_sync()
            with ctx, autocast:
                loss = model(input_ids=x, labels=x).loss / cfg.grad_accum
            scaler.scale(loss).backward()
            step_loss += loss.item()
        if cfg.grad_clip > 0:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        step += 1
        step_loss = ranks.mean(step_loss)
        if not math.isfinite(step_loss):  # every rank sees the same mean: all stop together
            raise SluiceError(
                f"training diverged: the loss was {step_loss} at step {step} "
                f"(learning_rate {cfg.learning_rate:g}); nothing was published. Lower "
                "learning_rate (or raise warmup_steps), or check the data"
            )
        interval_loss += step_loss
        interval_n += 1
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{step_loss:.3f}")
        if step % cfg.log_interval == 0 or step == total:
            elapsed = time.perf_counter() - interval_t
            mean = interval_loss / interval_n
            history.train.append((step, mean))
            if ranks.is_main:
                line = metric_line(
                    step=step,
                    train_loss=mean,
                    learning_rate=scheduler.get_last_lr()[0],
                    tokens_per_second=interval_n * tokens_per_step / elapsed,
                )
                (bar.write if bar else print)(line)
            interval_loss, interval_n, interval_t = 0.0, 0, time.perf_counter()
        if cfg.eval_interval and step % cfg.eval_interval == 0 and step < total:
            vloss = estimate_loss(raw_model, val_blocks, cfg, device, autocast)
            history.validation.append((step, vloss))
            if ranks.is_main:
                (bar.write if bar else print)(metric_line(step=step, validation_loss=vloss))
            model.train()
        stop_now = stop.requested or (stop.stop_after_step and step >= stop.stop_after_step)
        if ranks.any(bool(stop_now)):
            save_checkpoint()
            if bar is not None:
                bar.close()
            model = raw_model  # DDP freed before the process group is (Ranks.close)
            ranks.close()
            raise Interrupted(f"stopped at step {step} of {total}; checkpoint saved")
        if cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0 and step < total:
            save_checkpoint()
    if bar is not None:
        bar.close()
    model = raw_model  # DDP freed before the process group is (Ranks.close)
    report = {}
    final = raw_model
    if fsdp:  # gathered once, on rank 0, into an ordinary model to evaluate and publish
        state = sharding.full_state_dict(raw_model)
        if ranks.is_main:
            adapt = (lambda m: with_lora(m, cfg)) if cfg.finetune_method == "lora" else None
            final = sharding.plain_model(config, state, adapt).to(device)
        del state
    if ranks.is_main:
        report = finish(
            opt, cfg, final, tokenizer, history, stats, mode, source, block, device, named_base
        )
    # the other ranks wait for rank 0's evaluation and export: a worker that exits early makes
    # torchrun tear the job down under it
    ranks.barrier()
    ranks.close()
    return report


@torch.inference_mode()
def estimate_loss(model, blocks: PackedBlocks, cfg: TrainConfig, device, autocast) -> float:
    """Mean loss over the first eval_batches batches of packed validation blocks."""
    model.eval()
    losses = []
    n = min(len(blocks), cfg.eval_batches * cfg.batch_size)
    for start in range(0, n, cfg.batch_size):
        idx = range(start, min(start + cfg.batch_size, n))
        x = torch.from_numpy(np.stack([blocks.block(i) for i in idx])).to(device)
        with autocast:
            losses.append(model(input_ids=x, labels=x).loss.item())
    return float(np.mean(losses)) if losses else float("nan")


def held_out(opt: OptML, cfg: TrainConfig) -> list[str]:
    records = list(read_lines(opt.work_dir / "validation.txt"))
    if cfg.eval_max_records and len(records) > cfg.eval_max_records:
        # a fixed, content-independent subsample: every model sees the same records
        step = len(records) / cfg.eval_max_records
        records = [records[int(i * step)] for i in range(cfg.eval_max_records)]
    return records


def finish(
    opt, cfg, model, tokenizer, history, stats, mode, source, block, device, base=None
) -> dict:
    """Rank 0: evaluate against the champion, save model + edge export, then publish atomically.
    With `base` (lora_base=reference) the published folder names its base instead of a copy."""
    records = held_out(opt, cfg)
    model.eval()
    challenger = evaluate_model(model, tokenizer, records)
    baseline = None
    baseline_ch = opt.channel("baseline")
    if baseline_ch.exists() and any(baseline_ch.iterdir()):
        champion, champ_tok = load_model(unpack_model_source(baseline_ch, opt.work_dir))
        champion.to(device)
        baseline = evaluate_model(champion, champ_tok, records)
        del champion
    if not math.isfinite(challenger["loss"]):
        raise SluiceError(
            f"the trained model's held-out loss is {challenger['loss']}: not published"
        )
    report = evaluation_report(
        challenger, baseline, stats["train"]["fingerprint"], mode=mode, base_model=source
    )
    values = {
        "validation_loss": challenger["loss"],
        "validation_perplexity": challenger["perplexity"],
        "validation_byte_perplexity": challenger["byte_perplexity"],
    }
    if baseline:
        values["baseline_perplexity"] = baseline["perplexity"]
        values["baseline_byte_perplexity"] = baseline["byte_perplexity"]
    gate = report["comparison"]
    values["gate_challenger"] = gate["challenger"]
    if gate["baseline"] is not None:
        values["gate_baseline"] = gate["baseline"]
        values["gate_improvement"] = gate["improvement"]
    print(metric_line(**values), flush=True)

    staging = opt.work_dir / "model-staging"
    shutil.rmtree(staging, ignore_errors=True)
    model, published = publishable(model, staging, merge=cfg.lora_merge)
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    (staging / "evaluation.json").write_text(strict_json(report, indent=2) + "\n")
    info = {
        "sluice_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "mode": mode,
        "base_model": source,
        "block_size": block,
        "task_defaults": {"task": cfg.default_task, "max_new_tokens": cfg.max_new_tokens},
        "data": stats,
        "data_fingerprint": stats["train"]["fingerprint"],
        "metrics": values,
        "hyperparameters": cfg.to_dict(),
        "history": {"train": history.train, "validation": history.validation},
        **published,
        **({"base": base} if base else {}),
    }
    write_sluice_json(staging, info)  # first: the export loads the model as serving will
    if cfg.export_edge:
        from .export import export_edge

        info["edge"] = export_edge(staging, staging / "edge", cfg.edge_seq_len)
    write_sluice_json(staging, info)
    if cfg.loss_curve:
        plot_loss_curve(history, staging / "loss_curve.png")
    opt.output_data_dir.mkdir(parents=True, exist_ok=True)
    edge = staging / "edge"
    if base:  # the base's weights stay in S3; the edge export (whole weights) goes to output/
        freed = strip_weights(staging)
        if edge.is_dir():
            shutil.rmtree(opt.output_data_dir / "edge", ignore_errors=True)
            shutil.move(edge, opt.output_data_dir / "edge")
        edge = opt.output_data_dir / "edge"
        log.info(
            "lora_base=reference: %.1f MB of base weights not copied (%s)",
            freed / 1e6,
            base["s3_uri"],
        )
    else:
        edge = opt.model_dir / "edge"
    publish(staging, opt.model_dir)
    (opt.output_data_dir / "evaluation.json").write_text(strict_json(report, indent=2) + "\n")
    log.info("model written to %s", opt.model_dir)
    if cfg.artifacts_s3_uri:
        publish_artifacts(cfg.artifacts_s3_uri, opt.output_data_dir / "evaluation.json", edge)
    return report


def publish_artifacts(prefix: str, evaluation: Path, edge: Path) -> list[str]:
    """Upload evaluation.json and the edge export under `prefix` as plain S3 objects.

    SageMaker only uploads model.tar.gz; Neo and the model registry need these files on their
    own. A failed upload is logged, never fatal: the model itself is complete either way.
    """
    import boto3

    from .s3uri import split_s3

    bucket, key = split_s3(prefix.rstrip("/") + "/")
    files = [(evaluation, "evaluation.json")]
    if edge.is_dir():
        files += [(p, f"edge/{p.name}") for p in sorted(edge.iterdir()) if p.is_file()]
    s3, done = boto3.client("s3"), []
    for path, name in files:
        try:
            s3.upload_file(str(path), bucket, key + name)
            done.append(f"s3://{bucket}/{key}{name}")
        except Exception as e:  # botocore raises several types; any one is reported the same
            log.error("could not upload %s to s3://%s/%s%s: %s", path, bucket, key, name, e)
    log.info("published %d artifact(s) under %s", len(done), prefix)
    return done


def publish(staging: Path, model_dir: Path) -> None:
    """Move a complete model into model_dir: a failed job never leaves half a model there.

    Renames cannot fail for space, copies can: when the staging folder is on another filesystem
    than model_dir (SageMaker mounts /opt/ml/model), the model is first copied next to its
    destination, and only a complete copy is renamed into place, config.json last.
    """
    model_dir.mkdir(parents=True, exist_ok=True)
    source = staging
    if not _same_filesystem(staging, model_dir):
        source = model_dir / ".staging"
        shutil.rmtree(source, ignore_errors=True)
        try:
            shutil.copytree(staging, source)
        except OSError as e:
            shutil.rmtree(source, ignore_errors=True)
            raise SluiceError(
                f"cannot write the model to {model_dir} ({e}); nothing was published: give "
                "the job more volume (VolumeSizeInGB) or a smaller model"
            ) from None
    for item in sorted(source.iterdir(), key=lambda p: p.name == "config.json"):
        target = model_dir / item.name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        os.replace(item, target)
    source.rmdir()
    shutil.rmtree(staging, ignore_errors=True)


def _same_filesystem(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def plot_loss_curve(history: History, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if history.train:
        ax.plot(*zip(*history.train, strict=True), label="train loss")
    if history.validation:
        ax.plot(*zip(*history.validation, strict=True), "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("Sluice training")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
