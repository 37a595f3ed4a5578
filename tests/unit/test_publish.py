"""Publishing a trained model and writing checkpoints when the disk is full: nothing half done
is left where SageMaker (or the next attempt) would read it."""

from __future__ import annotations

import errno
import shutil

import pytest

from sluice import checkpoint, train
from sluice.errors import SluiceError


def staged(tmp_path):
    staging = tmp_path / "work" / "model-staging"
    (staging / "edge").mkdir(parents=True)
    for name in ("model.safetensors", "tokenizer.json", "config.json", "edge/model.pt"):
        (staging / name).write_text(name)
    return staging


def test_a_model_on_another_filesystem_is_copied_beside_its_destination_then_renamed(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(train, "_same_filesystem", lambda a, b: False)
    model_dir = tmp_path / "opt_ml" / "model"
    (model_dir).mkdir(parents=True)
    (model_dir / "old-file").write_text("from the image")
    train.publish(staged(tmp_path), model_dir)
    names = sorted(p.name for p in model_dir.iterdir())
    assert names == ["config.json", "edge", "model.safetensors", "old-file", "tokenizer.json"]
    assert (model_dir / "edge" / "model.pt").read_text() == "edge/model.pt"
    assert not (tmp_path / "work" / "model-staging").exists()


def test_a_full_disk_while_copying_the_model_publishes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "_same_filesystem", lambda a, b: False)
    copied = []
    copyfile = shutil.copyfile

    def one_file_then_full(src, dst, **kw):
        if copied:
            raise OSError(errno.ENOSPC, "No space left on device")
        copied.append(src)
        return copyfile(src, dst, **kw)

    monkeypatch.setattr(shutil, "copyfile", one_file_then_full)
    model_dir = tmp_path / "opt_ml" / "model"
    with pytest.raises(SluiceError, match=r"No space left on device.*nothing was published"):
        train.publish(staged(tmp_path), model_dir)
    assert list(model_dir.iterdir()) == []  # no partial weights, no config.json, no .staging


def test_a_full_disk_while_checkpointing_leaves_no_temporary_file(tmp_path, monkeypatch):
    def save(obj, path):
        with open(path, "wb") as f:
            f.write(b"half a checkpoint")
        raise RuntimeError("PytorchStreamWriter failed writing file: No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", save)
    with pytest.raises(SluiceError, match=r"cannot write checkpoint .*keep_checkpoints"):
        checkpoint.save(tmp_path, 10, {"model": {}}, keep=2)
    assert list(tmp_path.iterdir()) == []


def _model_and_optimizer(seed: int):
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_sharded_checkpoint_round_trips_and_a_full_disk_keeps_the_previous_one(
    tmp_path, monkeypatch
):
    """The FSDP layout in one process: torch.distributed.checkpoint's folder + trainer.pt, renamed
    into place; older ones pruned; a failed write leaves the newest complete one to resume."""
    import torch

    from sluice.distributed import Ranks

    model, optimizer = _model_and_optimizer(0)
    trainer = {"history": {"train": [[1, 2.0]]}, "fingerprint": "f"}
    for step in (5, 10):
        checkpoint.save_sharded(tmp_path, step, model, optimizer, trainer, 1, Ranks())
    assert [p.name for _, p in checkpoint.checkpoints(tmp_path)] == ["step-00000010.dcp"]

    def full(obj, path):
        raise RuntimeError("PytorchStreamWriter failed writing file: No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(SluiceError, match=r"cannot write checkpoint .*step-00000015\.dcp"):
        checkpoint.save_sharded(tmp_path, 15, model, optimizer, trainer, 1, Ranks())
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000010.dcp"]

    resumed = checkpoint.latest(tmp_path)
    assert resumed["step"] == 10 and resumed["fingerprint"] == "f"
    other, other_opt = _model_and_optimizer(1)
    checkpoint.load_sharded(resumed["sharded"], other, other_opt)
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    moments = [(s["exp_avg"], o["exp_avg"]) for s, o in
               zip(optimizer.state.values(), other_opt.state.values(), strict=True)]  # fmt: skip
    assert all(torch.equal(a, b) for a, b in moments)


@pytest.mark.parametrize(
    "codes,status",
    [([143], 143), ([-15, 143], 143), ([1, 143], 1), ([-15], 1), ([1], 1), ([-9, 143], 1)],
)
def test_a_job_whose_workers_stopped_for_sigterm_exits_143(codes, status):
    """torchrun SIGTERMs the other workers once one exits 143 (stopped, checkpoint saved): one
    still closing then dies of the signal (-15). Seen in CI as exit 1 for a clean stop."""
    from sluice.distributed import _job_status

    assert _job_status(codes) == status


def test_the_precision_log_line_says_what_is_really_trained():
    import torch

    from sluice.train import precision_text

    assert precision_text(torch.float32, None) == "float32 weights, float32 compute"
    assert precision_text(torch.bfloat16, torch.bfloat16) == (
        "float32 weights (the checkpoint's bfloat16, upcast), bfloat16 autocast compute"
    )
    # LoRA on a bf16 GPU: the frozen base stays bf16, only the adapters are float32
    assert precision_text(torch.float32, torch.bfloat16, torch.bfloat16) == (
        "float32 LoRA adapters on a bfloat16 frozen base, bfloat16 autocast compute"
    )
