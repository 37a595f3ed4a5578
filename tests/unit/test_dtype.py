"""The dtype `serve` picks: the checkpoint's own, where the hardware runs it natively."""

from __future__ import annotations

import json

import pytest
import torch

from sluice import serve
from sluice.errors import SluiceError

CPU = torch.device("cpu")


def checkpoint(tmp_path, dtype: str | None, key: str = "dtype"):
    cfg = {"model_type": "gpt2"} | ({key: dtype} if dtype else {})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize(
    ("saved", "key", "flags", "expected"),
    [
        ("float32", "dtype", ["amx_bf16"], torch.float32),
        ("bfloat16", "dtype", ["amx_bf16", "avx512_bf16"], torch.bfloat16),
        ("bfloat16", "torch_dtype", ["avx512_bf16"], torch.bfloat16),  # older transformers
        ("bfloat16", "dtype", [], torch.float32),  # emulated bf16 is slower than float32
        ("float16", "dtype", ["amx_bf16"], torch.bfloat16),  # fp16 on CPUs: 1.9x slower
        ("float16", "dtype", [], torch.float32),
        (None, "dtype", ["amx_bf16"], torch.float32),
    ],
)
def test_auto_follows_the_checkpoint_on_cpus(tmp_path, monkeypatch, saved, key, flags, expected):
    monkeypatch.delenv("SLUICE_DTYPE", raising=False)
    monkeypatch.setattr(serve, "cpu_bf16_flags", lambda: flags)
    dtype, why = serve.pick_dtype(CPU, checkpoint(tmp_path, saved, key))
    assert dtype == expected
    if saved == "bfloat16" and not flags:
        assert "no native bf16" in why  # the log line says why it runs upcast
    if expected == torch.bfloat16:
        assert flags[0] in why


def test_sluice_dtype_overrides_and_a_bad_one_is_refused(tmp_path, monkeypatch):
    model = checkpoint(tmp_path, "bfloat16")
    monkeypatch.setenv("SLUICE_DTYPE", "float32")
    assert serve.pick_dtype(CPU, model) == (torch.float32, "SLUICE_DTYPE")
    monkeypatch.setenv("SLUICE_DTYPE", "fp8")
    with pytest.raises(SluiceError, match="choose auto or one of"):
        serve.pick_dtype(CPU, model)


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile amx_bf16\n")
    assert serve.cpu_bf16_flags(str(info)) == ["amx_bf16", "avx512_bf16"]
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2\n")
    assert serve.cpu_bf16_flags(str(info)) == []
    assert serve.cpu_bf16_flags(str(tmp_path / "absent")) == []


@pytest.mark.parametrize(
    ("saved", "bf16", "expected"),
    [
        ("float32", True, torch.bfloat16),
        ("bfloat16", True, torch.bfloat16),
        ("float16", True, torch.float16),
        ("float16", False, torch.float16),
        ("bfloat16", False, torch.float32),  # a T4: bf16 weights can overflow float16
        ("float32", False, torch.float32),
    ],
)
def test_auto_on_gpus(tmp_path, monkeypatch, saved, bf16, expected):
    monkeypatch.delenv("SLUICE_DTYPE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    assert serve.pick_dtype(torch.device("cuda"), checkpoint(tmp_path, saved))[0] == expected
