"""Spot-safe checkpoints: model, optimizer, scheduler, scaler, RNG states and the data position.

Files are written atomically (temporary name, then rename), so an interruption mid-write leaves the
previous checkpoint intact; the newest complete one is resumed.
"""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path

import numpy as np
import torch

from .errors import SluiceError

log = logging.getLogger(__name__)
PATTERN = re.compile(r"^step-(\d+)\.pt$")


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


def save(folder: Path, step: int, state: dict, keep: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step:08d}.pt"
    tmp = folder / f".{path.name}.tmp"
    try:
        torch.save({**state, "step": step, "rng": rng_state()}, tmp)
    except (OSError, RuntimeError) as e:  # torch reports a full disk as RuntimeError
        tmp.unlink(missing_ok=True)
        raise SluiceError(
            f"cannot write checkpoint {path} ({e}); the checkpoint volume is full or not "
            "writable: give it more space, or keep fewer checkpoints (keep_checkpoints)"
        ) from None
    os.replace(tmp, path)
    for _, old in checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    log.info("checkpoint saved: %s", path)
    return path


def latest(folder: Path) -> dict | None:
    """The newest readable checkpoint, or None. A corrupt file is skipped with a warning."""
    for step, path in reversed(checkpoints(folder)):
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # a torn or foreign file must not stop the job
            log.warning("skipping unreadable checkpoint %s (step %d): %s", path, step, e)
    return None
