"""Edge export parity: TorchScript (Neo's input) and ONNX logits match eager logits."""

from __future__ import annotations

import json
import tarfile

import numpy as np
import onnxruntime as ort
import torch
from transformers import AutoModelForCausalLM

from sluice.export import PARITY_ATOL
from tests.helpers import read_json, run_sluice


def eager_logits(model_dir, ids: torch.Tensor) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.inference_mode():
        return model(input_ids=ids, use_cache=False).logits


def test_training_writes_a_neo_ready_edge_export(trained, tmp_path):
    edge = trained["model"] / "edge"
    info = read_json(edge / "neo.json")
    assert info == read_json(trained["model"] / "sluice.json")["edge"]
    seq = info["input"]["shape"][1]
    assert json.loads(info["neo"]["DataInputConfig"]) == {"input_ids": [1, seq]}
    assert info["neo"]["Framework"] == "PYTORCH"
    with tarfile.open(edge / "model.tar.gz") as tar:
        assert tar.getnames() == ["model.pth"]  # Neo wants the model at the archive's root
        tar.extractall(tmp_path, filter="data")
    assert info["parity"]["torchscript_max_abs_diff"] <= PARITY_ATOL
    assert info["parity"]["onnx_max_abs_diff"] <= PARITY_ATOL

    # fresh inputs, not the ones used at export time
    vocab = AutoModelForCausalLM.from_pretrained(trained["model"]).config.vocab_size
    ids = torch.randint(0, vocab, (1, seq), generator=torch.Generator().manual_seed(7))
    ref = eager_logits(trained["model"], ids)
    traced = torch.jit.load(str(tmp_path / "model.pth"))
    torch.testing.assert_close(traced(ids), ref, atol=PARITY_ATOL, rtol=0)

    session = ort.InferenceSession(str(edge / "model.onnx"), providers=["CPUExecutionProvider"])
    for n in (seq, seq // 2):  # the ONNX export keeps the sequence length dynamic
        got = session.run(["logits"], {"input_ids": ids[:, :n].numpy()})[0]
        np.testing.assert_allclose(got, ref[:, :n].numpy(), atol=PARITY_ATOL, rtol=0)


def test_export_command(trained, tmp_path):
    proc = run_sluice(
        "export", str(trained["model"]), "--output", str(tmp_path), "--seq-len", "8", "--no-onnx"
    )
    info = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert info["input"]["shape"] == [1, 8]
    assert (tmp_path / "model.tar.gz").exists() and not (tmp_path / "model.onnx").exists()
