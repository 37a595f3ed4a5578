"""Spot-safe checkpoints: model, optimizer, scheduler, scaler, RNG states and the data position.

Two layouts: `step-N.pt`, one file written by rank 0 (one process or DDP: every rank holds the
whole state), and `step-N.dcp/`, a torch.distributed.checkpoint folder in which every process
writes its own shards (FSDP), plus `trainer.pt` with the rest; it loads on any number of
processes. Both are written under a temporary name and renamed when complete, so an interruption
mid-write leaves the previous checkpoint intact; the newest complete one is resumed.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from .errors import SluiceError

log = logging.getLogger(__name__)
PATTERN = re.compile(r"^step-(\d+)\.(pt|dcp)$")
TRAINER = "trainer.pt"  # in a sharded checkpoint: what is not model or optimizer state


def rng_state() -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoints(folder: Path) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := PATTERN.match(p.name))]
    return sorted(found)


def _cannot_write(path: Path, e: Exception) -> SluiceError:
    return SluiceError(
        f"cannot write checkpoint {path} ({e}); the checkpoint volume is full or not "
        "writable: give it more space, or keep fewer checkpoints (keep_checkpoints)"
    )


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _prune(folder: Path, keep: int) -> None:
    for _, old in checkpoints(folder)[:-keep]:
        _remove(old)


def save(folder: Path, step: int, state: dict, keep: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step:08d}.pt"
    tmp = folder / f".{path.name}.tmp"
    try:
        torch.save({**state, "step": step, "rng": rng_state()}, tmp)
    except (OSError, RuntimeError) as e:  # torch reports a full disk as RuntimeError
        tmp.unlink(missing_ok=True)
        raise _cannot_write(path, e) from None
    os.replace(tmp, path)
    _prune(folder, keep)
    log.info("checkpoint saved: %s", path)
    return path


def save_sharded(folder: Path, step: int, model, optimizer, trainer: dict, keep: int, ranks):
    """Every rank writes its shards of the model and optimizer (FSDP); rank 0 adds `trainer`
    (scheduler, history, ...) and the first process of each instance renames the folder into
    place once all are done. A failure on any rank fails every rank the same way."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = folder / f"step-{step:08d}.dcp"
    tmp = folder / f".{path.name}.tmp"
    if ranks.local_rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    ranks.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    error = None
    try:
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=tmp)
        if ranks.is_main:
            torch.save({**trainer, "step": step, "rng": rng_state()}, tmp / TRAINER)
    # DCP wraps a full disk in a CheckpointException (a BaseException) holding tracebacks
    except (Exception, CheckpointException) as e:
        error = (str(e).strip().splitlines() or [type(e).__name__])[-1]
    if ranks.any(error is not None):
        if ranks.local_rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise _cannot_write(path, error or "another process could not write its shards") from None
    if ranks.local_rank == 0:
        _remove(path)
        os.replace(tmp, path)
        _prune(folder, keep)
    ranks.barrier()
    if ranks.is_main:
        log.info("checkpoint saved: %s (sharded over %d processes)", path, ranks.world_size)
    return path


def load_sharded(path: Path, model, optimizer) -> None:
    """Read a sharded checkpoint into `model` and `optimizer`, resharded for however many
    processes run now (one, unsharded, included)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
    )


def latest(folder: Path) -> dict | None:
    """The newest readable checkpoint, or None. A corrupt file is skipped with a warning."""
    for step, path in reversed(checkpoints(folder)):
        try:
            if path.suffix == ".dcp":  # the shards are read later, into the sharded model
                return {**torch.load(path / TRAINER, weights_only=False), "sharded": path}
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # a torn or foreign file must not stop the job
            log.warning("skipping unreadable checkpoint %s (step %d): %s", path, step, e)
    return None
