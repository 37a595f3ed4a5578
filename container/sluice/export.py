"""Edge export: a fixed-shape TorchScript trace packed for SageMaker Neo, and ONNX.

transformers 5 models return dict-like outputs even with torchscript=True, which tracing rejects;
a thin module that returns the logits tensor traces cleanly. Eager attention and no KV cache keep
the graph to operators Neo's compiler knows.
"""

from __future__ import annotations

import json
import logging
import tarfile
import warnings
from pathlib import Path

import torch

from .model import load_model

# What CreateCompilationJob needs for this artifact (see README "Edge variant").
NEO_FRAMEWORK = "PYTORCH"
NEO_FRAMEWORK_VERSION = "2.0"  # the newest PyTorch version Neo's cloud targets accept
PARITY_ATOL = 1e-4  # traced / ONNX logits vs eager, float32


class LogitsOnly(torch.nn.Module):
    """input_ids [batch, seq] (int64) -> logits [batch, seq, vocab], no cache, no dict output."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True).logits


def example_input(vocab_size: int, seq_len: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (1, seq_len), generator=g, dtype=torch.long)


def export_edge(model_dir: Path, out: Path, seq_len: int = 128, onnx: bool = True) -> dict:
    """Trace and export (see _export_edge), without the exporters' pages of advisory output."""
    for name in ("onnxscript", "onnx_ir", "torch.onnx", "torch.export"):
        logging.getLogger(name).setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
        warnings.simplefilter("ignore", category=FutureWarning)
        return _export_edge(model_dir, out, seq_len, onnx)


def _export_edge(model_dir: Path, out: Path, seq_len: int, onnx: bool) -> dict:
    """Write out/model.tar.gz (Neo input: model.pth at its root), out/model.onnx and out/neo.json.

    Returns the description recorded in sluice.json, including the measured parity.
    """
    out.mkdir(parents=True, exist_ok=True)
    model, _ = load_model(model_dir, dtype=torch.float32, attn="eager")
    model.eval()
    context = getattr(model.config, "n_positions", None) or model.config.max_position_embeddings
    seq_len = min(seq_len, context)
    wrapped = LogitsOnly(model).eval()
    x = example_input(model.config.vocab_size, seq_len)
    with torch.inference_mode():
        eager = wrapped(x)
    with torch.no_grad():
        traced = torch.jit.trace(wrapped, (x,), check_trace=False)
    pth = out / "model.pth"
    traced.save(str(pth))
    with torch.inference_mode():
        traced_diff = (torch.jit.load(str(pth))(x) - eager).abs().max().item()
    with tarfile.open(out / "model.tar.gz", "w:gz") as tar:
        tar.add(pth, arcname="model.pth")
    pth.unlink()
    info = {
        "torchscript": "edge/model.tar.gz",
        "input": {"name": "input_ids", "dtype": "int64", "shape": [1, seq_len]},
        "neo": {
            "Framework": NEO_FRAMEWORK,
            "FrameworkVersion": NEO_FRAMEWORK_VERSION,
            "DataInputConfig": json.dumps({"input_ids": [1, seq_len]}),
            # token ids are integers; Neo assumes float32 inputs unless told
            "CompilerOptions": json.dumps({"dtype": "int64"}),
        },
        "parity": {"torchscript_max_abs_diff": traced_diff, "atol": PARITY_ATOL},
    }
    if onnx:
        info["onnx"] = "edge/model.onnx"
        info["parity"]["onnx_max_abs_diff"] = export_onnx(wrapped, x, eager, out / "model.onnx")
    (out / "neo.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def export_onnx(
    wrapped: torch.nn.Module, x: torch.Tensor, eager: torch.Tensor, path: Path
) -> float:
    """Export with the dynamo exporter (sequence length dynamic) and check it in onnxruntime."""
    import onnxruntime as ort

    seq = torch.export.Dim("seq", min=2, max=x.shape[1])
    program = torch.onnx.export(
        wrapped,
        (x,),
        dynamo=True,
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_shapes={"input_ids": {1: seq}},
        verbose=False,
    )
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(["logits"], {"input_ids": x.numpy()})[0]
    return float(abs(torch.from_numpy(got) - eager).max())
