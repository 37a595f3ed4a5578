"""The `train` command end to end on CPU: scratch, fine-tune, resume, SIGTERM, DDP, /opt/ml."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers import (
    MotoServer,
    Server,
    hp,
    read_json,
    run_sluice,
    sets,
    tiny_llama,
    train_losses,
)

MODEL_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "sluice.json",
    "evaluation.json",
}


def train(data: Path, out: Path, *flags: str, **hyperparameters):
    """`sluice train --train DATA --output OUT FLAGS...` with TINY hyperparameters and these."""
    return run_sluice(
        "train", "--train", str(data), "--output", str(out), *flags, *sets(hp(**hyperparameters))
    )


def test_scratch_training_lowers_loss_and_reopens_with_plain_transformers(trained):
    losses = train_losses(trained["stdout"])
    assert len(losses) == 8
    assert losses[-1] < 0.6 * losses[0], losses
    model_dir = trained["model"]
    assert MODEL_FILES | {"loss_curve.png", "edge"} <= {p.name for p in model_dir.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.model_type == "gpt2" and model.config.n_layer == 2
    ids = tok("The cat eats", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[1] == ids["input_ids"].shape[1] + 5

    info = read_json(model_dir / "sluice.json")
    assert info["mode"] == "scratch"
    assert info["data"]["train"]["duplicate"] > 0  # the generated corpus repeats sentences
    assert info["task_defaults"] == {"task": "generate", "max_new_tokens": 32}
    report = read_json(model_dir / "evaluation.json")
    assert report == read_json(trained["out"] / "output" / "data" / "evaluation.json")
    ch = report["challenger"]
    assert ch["perplexity"] < len(tok) / 10  # far better than guessing
    assert report["data_fingerprint"] == info["data_fingerprint"]
    assert "validation_perplexity=" in trained["stdout"]


@pytest.mark.parametrize(
    "start", ["pretrained", pytest.param("warm_start", marks=pytest.mark.slow)]
)
def test_finetune_from_a_tarball_compared_with_the_champion(tmp_path, trained, corpus_dir, start):
    # the champion model as a model.tar.gz (as SageMaker stores it and fills a channel with),
    # given as `baseline` and fine-tuned from (as `pretrained` too, or warm_start): fine-tuning
    # keeps the tokenizer, so per-token perplexity is comparable
    tar = tmp_path / "champion" / "model.tar.gz"
    tar.parent.mkdir()
    with tarfile.open(tar, "w:gz") as t:
        for p in trained["model"].iterdir():
            t.add(p, arcname=p.name)
    out = tmp_path / "job"
    source = ["--pretrained", str(tar.parent)] if start == "pretrained" else []
    proc = run_sluice(
        "train",
        "--train",
        str(corpus_dir / "train"),
        *source,
        "--baseline",
        str(tar.parent),
        "--output",
        str(out),
        *sets(hp(max_steps=10, learning_rate=0.001, warm_start=str(start == "warm_start"))),
    )
    report = read_json(out / "model" / "evaluation.json")
    assert report["mode"] == "finetune"
    assert report["comparison"]["metric"] == "perplexity"
    assert report["comparison"]["same_tokenizer"] is True
    assert report["baseline"]["records"] == report["challenger"]["records"]
    assert "baseline_perplexity=" in proc.stdout
    gate = report["comparison"]
    assert f"gate_challenger={gate['challenger']:.6g}" in proc.stdout
    assert f"gate_baseline={gate['baseline']:.6g}" in proc.stdout
    assert f"gate_improvement={gate['improvement']:.6g}" in proc.stdout
    assert (out / "model" / "tokenizer.json").read_text() == (
        trained["model"] / "tokenizer.json"
    ).read_text()


@pytest.mark.slow
def test_warm_start_from_the_baseline_channel_publishes_artifacts_to_s3(
    tmp_path, trained, corpus_dir
):
    """As the retraining state machine runs it: one `baseline` channel (the champion) is both the
    starting point and the comparison; evaluation.json and the edge export land in S3 as plain
    objects for the model registry and Neo."""
    server = MotoServer()
    try:
        env, s3 = server.env, server.s3
        s3.create_bucket(Bucket="sluice-data")
        out = tmp_path / "job"
        run_sluice(
            "train",
            "--train",
            str(corpus_dir / "train"),
            "--baseline",
            str(trained["model"]),
            "--output",
            str(out),
            *sets(
                hp(
                    max_steps=5,
                    warm_start="true",
                    export_edge="true",
                    artifacts_s3_uri="s3://sluice-data/models/job-1/artifacts/",
                )
            ),
            env=env,
        )
        report = read_json(out / "model" / "evaluation.json")
        assert report["mode"] == "finetune" and report["comparison"]["same_tokenizer"] is True
        keys = {o["Key"] for o in s3.list_objects_v2(Bucket="sluice-data")["Contents"]}
        prefix = "models/job-1/artifacts/"
        assert {
            prefix + "evaluation.json",
            prefix + "edge/model.tar.gz",
            prefix + "edge/model.onnx",
            prefix + "edge/neo.json",
        } <= keys
        body = s3.get_object(Bucket="sluice-data", Key=prefix + "evaluation.json")["Body"].read()
        assert json.loads(body)["comparison"] == report["comparison"]
    finally:
        server.stop()


def test_champion_with_another_tokenizer_is_compared_per_byte(tmp_path, trained, corpus_dir):
    out = tmp_path / "job"
    run_sluice(
        "train",
        "--train",
        str(corpus_dir / "train"),
        "--baseline",
        str(trained["model"]),
        "--output",
        str(out),
        *sets(hp(max_steps=5, vocab_size=320)),
    )
    comparison = read_json(out / "model" / "evaluation.json")["comparison"]
    assert comparison["same_tokenizer"] is False
    assert comparison["metric"] == "byte_perplexity"


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(model_dir / "model.safetensors")


@pytest.mark.slow
def test_activation_checkpointing_trains_the_same_model(tmp_path, corpus_dir):
    """Recomputing activations in the backward pass changes memory, not the arithmetic."""
    runs = {}
    for flag in ("false", "true"):
        out = tmp_path / flag
        proc = train(
            corpus_dir / "train", out, max_steps=6, log_interval=1, activation_checkpointing=flag
        )
        runs[flag] = (train_losses(proc.stdout), load_file(out / "model" / "model.safetensors"))
    (losses, weights), (losses_ckpt, weights_ckpt) = runs["false"], runs["true"]
    assert len(losses) == 6
    assert losses_ckpt == pytest.approx(losses, abs=1e-5)
    for name in weights:
        torch.testing.assert_close(weights[name], weights_ckpt[name], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_resume_after_interruption_equals_the_uninterrupted_run(tmp_path, corpus_dir):
    params = hp(max_steps=20, checkpoint_interval=5, dropout=0.1)
    train = ["train", "--train", str(corpus_dir / "train")]
    full = tmp_path / "full"
    run_sluice(*train, "--output", str(full), *sets(params))

    part = tmp_path / "part"
    stopped = run_sluice(
        *train,
        "--output",
        str(part),
        *sets(params),
        env={"SLUICE_STOP_AFTER_STEP": "12"},
        check=False,
    )
    assert stopped.returncode == 143, stopped.stdout[-2000:]
    assert not (part / "model").exists() or not any((part / "model").iterdir())
    ckpts = sorted(p.name for p in (part / "checkpoints").glob("step-*.pt"))
    assert ckpts == ["step-00000010.pt", "step-00000012.pt"]  # keep_checkpoints=2
    resumed = run_sluice(*train, "--output", str(part), *sets(params))
    assert "resumed from checkpoint at step 12" in resumed.stdout

    a, b = weights(full / "model"), weights(part / "model")
    # same data order, RNG and optimizer state: identical up to float rounding on CPU
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-5)
    loss_full = read_json(full / "model" / "evaluation.json")["challenger"]["loss"]
    loss_part = read_json(part / "model" / "evaluation.json")["challenger"]["loss"]
    assert loss_part == pytest.approx(loss_full, abs=1e-5)


@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_sigterm_writes_a_checkpoint_and_exits(tmp_path, corpus_dir, nproc):
    """StopTrainingJob or a spot interruption: a checkpoint, then 143 (128 + SIGTERM), also
    when torchrun runs the workers (it passes the signal on; before, it exited 1 with a
    traceback)."""
    out = tmp_path / "job"
    cmd = [
        sys.executable,
        "-m",
        "sluice.cli",
        "train",
        "--train",
        str(corpus_dir / "train"),
        "--output",
        str(out),
        "--nproc",
        str(nproc),
        *sets(hp(max_steps=100000, log_interval=1, batch_size=4)),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "train_loss=" in line:
            break
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    elapsed = time.monotonic() - sent
    assert proc.returncode == 143, "".join(lines) + rest
    assert "SIGTERM received" in rest and "checkpoint saved" in rest
    assert "Traceback" not in rest
    assert list((out / "checkpoints").glob("step-*.pt"))
    assert elapsed < 120  # SageMaker's grace period before SIGKILL
    assert not (out / "output" / "failure").exists()


@pytest.mark.slow
def test_two_process_ddp_on_cpu_has_one_writer(tmp_path, corpus_dir):
    out = tmp_path / "job"
    proc = train(
        corpus_dir / "train", out, "--nproc", "2", max_steps=10, checkpoint_interval=5, batch_size=4
    )
    assert "--nproc_per_node=2" in proc.stdout
    assert "world size 2" in proc.stdout
    assert proc.stdout.count("model written to") == 1
    assert {p.name for p in (out / "model").iterdir()} >= MODEL_FILES
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*.pt")) == ["step-00000005.pt"]
    AutoModelForCausalLM.from_pretrained(out / "model")


@pytest.mark.slow
def test_fsdp_over_two_processes_trains_as_one_process_and_resumes_on_one(tmp_path, corpus_dir):
    """FSDP shards weights, gradients and AdamW state over 2 processes (gloo on CPU): the same
    losses and weights as one process with the same global batch. Its sharded checkpoint,
    written by 2 processes, resumes on 1 (resharded by torch.distributed.checkpoint), and
    under DDP on 2."""
    data = corpus_dir / "train"
    same = {"max_steps": 10, "log_interval": 1, "checkpoint_interval": 5, "dropout": 0}
    one = train(data, tmp_path / "one", **same, batch_size=8)

    part = tmp_path / "part"
    stopped = run_sluice(
        "train", "--train", str(data), "--output", str(part), "--nproc", "2",
        *sets(hp(**same, batch_size=4, distributed="fsdp")),
        env={"SLUICE_STOP_AFTER_STEP": "6"},
        check=False,
    )  # fmt: skip
    assert stopped.returncode == 143, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    assert "FSDP: 2 blocks sharded" in stopped.stdout + stopped.stderr
    assert train_losses(stopped.stdout) == pytest.approx(train_losses(one.stdout)[:6], abs=1e-4)
    shards = part / "checkpoints" / "step-00000006.dcp"
    assert {p.name for p in shards.iterdir()} >= {"__0_0.distcp", "__1_0.distcp", "trainer.pt"}

    # the same sharded checkpoint also resumes under DDP over 2 processes (full state dicts)
    shutil.copytree(part / "checkpoints", tmp_path / "ddp" / "checkpoints")
    resumed = train(data, part, **same, batch_size=8, distributed="fsdp")
    assert "resumed from checkpoint at step 6" in resumed.stdout + resumed.stderr
    assert train_losses(resumed.stdout) == pytest.approx(train_losses(one.stdout)[6:], abs=1e-4)
    ddp = train(data, tmp_path / "ddp", "--nproc", "2", **same, batch_size=4)
    assert "resumed from checkpoint at step 6" in ddp.stdout + ddp.stderr
    assert train_losses(ddp.stdout) == pytest.approx(train_losses(one.stdout)[6:], abs=1e-4)
    a = weights(tmp_path / "one" / "model")
    for b in (weights(part / "model"), weights(tmp_path / "ddp" / "model")):
        for name in a:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-4)
    assert not list((part / "checkpoints").glob(".*.tmp"))


@pytest.mark.slow
def test_lora_under_fsdp_publishes_one_merged_model(tmp_path, trained, corpus_dir):
    """Frozen base and trainable adapters sharded together; the model is gathered once, merged,
    and written by rank 0 only."""
    base = tiny_llama(tmp_path / "base", trained["model"])
    out = tmp_path / "job"
    proc = train(
        corpus_dir / "train", out, "--pretrained", str(base), "--nproc", "2",
        finetune_method="lora", distributed="fsdp", batch_size=4, max_steps=6, grad_accum=2,
        activation_checkpointing="true", eval_interval=3,
    )  # fmt: skip
    log = proc.stdout + proc.stderr
    assert "world size 2" in log and log.count("model written to") == 1
    assert (out / "model" / "adapter" / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert type(model).__name__ == "LlamaForCausalLM"
    before, after = load_file(base / "model.safetensors"), weights(out / "model")
    assert set(before) == set(after)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in changed)


def opt_ml_tree(root: Path, hyperparameters: dict, files: dict[str, bytes | str]) -> Path:
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))
    (config / "resourceconfig.json").write_text(
        json.dumps(
            {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "eth0"}
        )
    )
    for rel, content in files.items():
        path = root / "input" / "data" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root


def test_opt_ml_contract_end_to_end(tmp_path):
    import gzip

    from sluice_local.corpus import generate

    lines = generate(1200, seed=5)
    jsonl = "\n".join(json.dumps({"id": i, "body": t}) for i, t in enumerate(lines[:600]))
    csv = "id,body\n" + "\n".join(f'{i},"{t}"' for i, t in enumerate(lines[600:]))
    root = opt_ml_tree(
        tmp_path / "opt_ml",
        hp(max_steps=8, text_field="body", text_column="body"),
        {"train/a/part.jsonl": jsonl, "train/b/part.csv.gz": gzip.compress(csv.encode())},
    )
    proc = run_sluice("train", env={"SLUICE_OPT_ML": str(root)})
    assert {p.name for p in (root / "model").iterdir()} >= MODEL_FILES
    assert (root / "output" / "data" / "evaluation.json").exists()
    assert not (root / "output" / "failure").exists()
    assert "train_loss=" in proc.stdout


@pytest.mark.parametrize(
    "hyperparameters, files, reason",
    [
        (
            hp(learning_rate="fast"),
            {"train/t.txt": "a\nb\n"},
            "hyperparameter learning_rate='fast' is not a number",
        ),
        (
            hp(learning_rate="nan"),
            {"train/t.txt": "a\nb\n"},
            "learning_rate must be a positive finite number, not nan",
        ),
        (
            hp(learning_rate="1000", max_steps="8", grad_clip="0"),
            {"train/t.txt": "".join(f"the cat {i} eats fish at noon.\n" for i in range(200))},
            "training diverged: the loss was",
        ),
        (hp(batch_size="1e30"), {"train/t.txt": "a\n"}, "batch_size=1000000000000000019884"),
        (hp(batch_size="inf"), {"train/t.txt": "a\n"}, "batch_size='inf' is not an integer"),
        (
            None,  # hyperparameters.json that is not JSON
            {"train/t.txt": "a\n"},
            "hyperparameters.json is not valid JSON",
        ),
        (hp(), {"train/t.csv": "id,body\n1,hello\n"}, "no column 'text' in header"),
        (hp(), {"train/t.txt": "\n \n"}, "has no usable records"),
        (hp(), {"train/t.txt": b"ok\n\xff\xfe broken\n"}, "are not UTF-8"),
        (
            hp(),
            {
                "train/t.txt": "a\n",
                "pretrained/config.json": json.dumps(
                    {
                        "model_type": "bert",
                        "vocab_size": 10,
                        "hidden_size": 8,
                        "num_hidden_layers": 1,
                        "num_attention_heads": 1,
                        "intermediate_size": 8,
                    }
                ),
            },
            "is not a causal (decoder-only) language model",
        ),
    ],
    ids=[
        "bad-hyperparameter",
        "nan-learning-rate",
        "diverges",
        "huge-batch",
        "infinite-batch",
        "hyperparameters-not-json",
        "csv-without-column",
        "empty-channel",
        "undecodable",
        "encoder",
    ],
)
def test_bad_input_fails_fast_with_one_line_and_no_model(tmp_path, hyperparameters, files, reason):
    root = opt_ml_tree(tmp_path / "opt_ml", hyperparameters or {}, files)
    if hyperparameters is None:
        (root / "input" / "config" / "hyperparameters.json").write_text("{learning_rate: 1e-4")
    proc = run_sluice("train", env={"SLUICE_OPT_ML": str(root)}, check=False)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    failure = (root / "output" / "failure").read_text()
    assert reason in failure and failure.count("\n") == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (root / "model").exists() or not any((root / "model").iterdir())


def test_a_tokenizer_larger_than_the_embedding_is_fitted_before_the_first_step(
    tmp_path, trained, corpus_dir
):
    """As some Qwen2 checkpoints ship: a pad token whose id is the embedding's size (here two new
    tokens, the pad one of them). The embedding grows (with a log line) before training, and
    every step and the evaluation run (before: a crash after the last step)."""
    import shutil

    from transformers import AutoConfig, AutoTokenizer

    pretrained = tmp_path / "pretrained"
    shutil.copytree(trained["model"], pretrained)
    tok = AutoTokenizer.from_pretrained(pretrained)
    rows = AutoConfig.from_pretrained(pretrained).vocab_size
    assert len(tok) == rows
    tok.add_special_tokens({"pad_token": "<|newpad|>", "additional_special_tokens": ["<|x|>"]})
    tok.save_pretrained(pretrained)
    out = tmp_path / "job"
    proc = train(corpus_dir / "train", out, "--pretrained", str(pretrained), max_steps=4)
    assert f"the tokenizer has {rows + 2} tokens, the model's embedding {rows} rows" in (
        proc.stdout + proc.stderr
    )
    assert AutoConfig.from_pretrained(out / "model").vocab_size == rows + 2
    assert read_json(out / "model" / "evaluation.json")["challenger"]["records"] > 0


@pytest.mark.slow
def test_lora_fine_tunes_a_llama_that_reloads_with_plain_transformers_and_beats_its_base(
    tmp_path, trained, corpus_dir
):
    base = tiny_llama(tmp_path / "base", trained["model"])
    out = tmp_path / "job"
    proc = train(
        corpus_dir / "train",
        out,
        "--pretrained",
        str(base),
        "--baseline",
        str(base),
        finetune_method="lora",
        lora_r=8,
        max_steps=40,
        learning_rate=0.01,
        warmup_steps=5,
    )
    log = proc.stdout + proc.stderr
    assert "LoRA rank 8 (alpha 16) on q_proj, v_proj" in log
    report = read_json(out / "model" / "evaluation.json")
    gate = report["comparison"]
    assert gate["challenger"] < gate["baseline"], gate  # held-out perplexity, same records
    # merged: a plain Llama checkpoint, no PEFT needed to load or serve it
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not any("lora" in name for name in load_file(out / "model" / "model.safetensors"))
    assert (out / "model" / "adapter" / "adapter_config.json").exists()
    before = load_file(base / "model.safetensors")
    after = load_file(out / "model" / "model.safetensors")
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in changed)


def test_a_bfloat16_checkpoint_trains_with_float32_master_weights_on_cpu(
    tmp_path, trained, corpus_dir
):
    """AdamW on bf16 weights loses most small updates; the log says what is really used."""
    import torch
    from transformers import AutoModelForCausalLM

    bf16 = tmp_path / "bf16"
    model = AutoModelForCausalLM.from_pretrained(trained["model"], dtype=torch.bfloat16)
    model.save_pretrained(bf16)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (bf16 / name).write_bytes((trained["model"] / name).read_bytes())
    out = tmp_path / "job"
    proc = train(
        corpus_dir / "train", out, "--pretrained", str(bf16), max_steps=4, checkpoint_interval=2
    )
    log = proc.stdout + proc.stderr
    assert "precision: float32 weights (the checkpoint's bfloat16, upcast), float32 compute" in log
    (ckpt,) = (out / "checkpoints").glob("step-*.pt")
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert {t.dtype for t in state["model"].values()} == {torch.float32}
    moments = [v for s in state["optimizer"]["state"].values() for v in s.values()]
    assert {t.dtype for t in moments if t.dim() > 0} == {torch.float32}


@pytest.mark.parametrize("damage", ["truncated", "bad-header"])
def test_a_damaged_pretrained_model_fails_with_one_line(tmp_path, trained, damage):
    """An upload cut short or a file that is not safetensors: one line saying so, exit 1."""
    import shutil

    root = opt_ml_tree(tmp_path / "opt_ml", hp(max_steps=2), {"train/t.txt": "a b\n"})
    pretrained = root / "input" / "data" / "pretrained"
    shutil.copytree(trained["model"], pretrained)
    weights = pretrained / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\xff" * 8 + data[8:])
    proc = run_sluice("train", env={"SLUICE_OPT_ML": str(root)}, check=False)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    failure = (root / "output" / "failure").read_text()
    assert "the weights (*.safetensors) cannot be read" in failure and failure.count("\n") == 1
    assert "upload the model again" in failure
    assert "Traceback" not in proc.stdout + proc.stderr


def test_evaluate_command_scores_several_models_on_the_same_records(trained, corpus_dir):
    proc = run_sluice(
        "evaluate",
        str(trained["model"]),
        str(trained["model"]),
        "--data",
        str(corpus_dir / "heldout"),
        "--max-records",
        "50",
    )
    result = json.loads(proc.stdout[proc.stdout.index("{") :])
    (only,) = result.values()  # the same folder twice is one entry
    assert only["records"] == 50 and only["perplexity"] > 1


BASE_URI = "s3://sluice-data/models/base/model.tar.gz"


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory, trained, corpus_dir):
    """One Llama base (in S3 as a model.tar.gz too) adapted three ways: merged, lora_merge=false
    with a copy of the base, and lora_merge=false naming the base in S3 (lora_base=reference)."""
    tmp = tmp_path_factory.mktemp("lora")
    base = tiny_llama(tmp / "base", trained["model"], heads=2)
    server = MotoServer()
    server.s3.create_bucket(Bucket="sluice-data")
    with tarfile.open(tmp / "base.tar.gz", "w:gz") as tar:
        for f in base.iterdir():
            tar.add(f, arcname=f.name)
    server.s3.upload_file(str(tmp / "base.tar.gz"), "sluice-data", "models/base/model.tar.gz")
    env = {**server.env, "SLUICE_BASE_CACHE": str(tmp / "cache")}
    runs = {}
    for kind, extra in {
        "true": {"lora_merge": "true", "export_edge": "false"},
        "false": {"lora_merge": "false", "export_edge": "true"},
        "reference": {"lora_merge": "false", "lora_base": "reference", "export_edge": "true"},
    }.items():
        runs[kind] = tmp / f"merge-{kind}"
        run_sluice(
            "train", "--train", str(corpus_dir / "train"), "--output", str(runs[kind]),
            "--pretrained", str(base),
            *sets(hp(
                finetune_method="lora", max_steps=12, learning_rate=0.02, warmup_steps=2,
                pretrained_s3_uri=BASE_URI, **extra,
            )),
            env=env,
        )  # fmt: skip
    yield {"base": base, "runs": runs, "env": env, "server": server, "tmp": tmp}
    server.stop()


@pytest.mark.slow
def test_lora_merge_false_publishes_the_untouched_base_and_serve_applies_the_adapter(
    lora_runs, monkeypatch
):
    """The adapter is the only copy of what training learned; vLLM applies it when serving,
    every other job (export, monitoring, evaluation, torch scoring) merges it on load. With
    lora_base=reference the same adapter is published alone, naming its base in S3, and serve
    fetches the base (the model served here is that one)."""
    from sluice.model import load_model

    base, runs = lora_runs["base"], lora_runs["runs"]
    model_dir = runs["false"] / "model"
    assert read_json(model_dir / "sluice.json")["lora"] == {
        "adapter": "adapter", "merged": False, "r": 8, "alpha": 16
    }  # fmt: skip
    before, published = load_file(base / "model.safetensors"), weights(model_dir)
    assert set(before) == set(published)
    assert all(torch.equal(before[n], published[n]) for n in before), "the base was changed"
    # the edge export loaded it as every job does: merged
    assert (model_dir / "edge").is_dir()
    merged = weights(runs["true"] / "model")
    loaded, tok = load_model(model_dir)
    loaded_weights = loaded.state_dict()
    changed = [n for n in before if not torch.equal(before[n], merged[n])]
    assert changed
    for n in before:
        torch.testing.assert_close(loaded_weights[n], merged[n], rtol=0, atol=1e-6)

    # by reference: the same adapter (same seed and data), no weights, the base named by ETag
    by_ref = runs["reference"] / "model"
    assert not list(by_ref.glob("*.safetensors")) and not (by_ref / "edge").exists()
    etag = lora_runs["server"].s3.head_object(Bucket="sluice-data", Key="models/base/model.tar.gz")
    info = read_json(by_ref / "sluice.json")
    assert info["base"] == {
        "s3_uri": BASE_URI, "etag": etag["ETag"], "size": etag["ContentLength"]
    }  # fmt: skip
    assert info["lora"] == read_json(model_dir / "sluice.json")["lora"]
    mine = load_file(by_ref / "adapter" / "adapter_model.safetensors")
    theirs = load_file(model_dir / "adapter" / "adapter_model.safetensors")
    assert all(torch.equal(mine[n], theirs[n]) for n in theirs)
    size = sum(f.stat().st_size for f in by_ref.rglob("*") if f.is_file())
    assert size < sum(f.stat().st_size for f in model_dir.rglob("*") if f.is_file()) / 2

    prompts = ["The lazy cat eats", "In the desert there is often", "Every horse likes"]
    server = Server(by_ref, **lora_runs["env"])
    try:
        out = server.lines(
            [{"text": t, "task": "next_token", "parameters": {"top_k": 5}} for t in prompts]
        )
        log = "".join(server.log)
    finally:
        server.stop()
    assert "LoRA adapter" in log and "(rank 8)" in log, log
    assert f"its base {BASE_URI}" in log, log
    base_model, _ = load_model(base)
    moved = 0.0
    for text, o in zip(prompts, out, strict=True):
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad():
            want = loaded(ids).logits[0, -1].softmax(-1)
            was = base_model(ids).logits[0, -1].softmax(-1)
        served = {t["id"]: t["prob"] for t in o["next_tokens"]}
        assert list(served) == want.topk(5).indices.tolist(), (text, o)
        for i, p in served.items():  # vLLM with the adapter = the merged model, not the base
            assert p == pytest.approx(want[i].item(), rel=1e-3, abs=1e-6)
            moved = max(moved, abs(p - was[i].item()))
    assert moved > 1e-3


@pytest.mark.slow
def test_retraining_an_adapter_that_names_its_base_names_the_same_base(
    lora_runs, corpus_dir, monkeypatch
):
    """The retraining loop with lora_base=reference: the champion is an adapter naming its base;
    the challenger trains that adapter further on the same base and names it too (never a
    merged model it could not name). A base replaced in S3 is refused, not silently used."""
    from sluice.errors import SluiceError
    from sluice.model import load_model

    env, runs, tmp = lora_runs["env"], lora_runs["runs"], lora_runs["tmp"]
    champion = runs["reference"] / "model"
    out = tmp / "retrained"
    proc = run_sluice(
        "train", "--train", str(corpus_dir / "train"), "--baseline", str(champion),
        "--output", str(out),
        *sets(hp(
            finetune_method="lora", lora_merge="false", lora_base="reference", warm_start="true",
            max_steps=6, learning_rate=0.02, warmup_steps=1, export_edge="false",
        )),
        env=env,
    )  # fmt: skip
    assert "training the adapter" in proc.stderr + proc.stdout
    retrained = out / "model"
    assert (
        read_json(retrained / "sluice.json")["base"] == read_json(champion / "sluice.json")["base"]
    )
    assert not list(retrained.glob("*.safetensors"))
    report = read_json(retrained / "evaluation.json")
    assert report["comparison"]["baseline"] is not None  # the champion loaded with its base
    before = load_file(champion / "adapter" / "adapter_model.safetensors")
    after = load_file(retrained / "adapter" / "adapter_model.safetensors")
    assert set(before) == set(after) and any(not torch.equal(before[n], after[n]) for n in before)

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    loaded, _ = load_model(retrained)  # through the cache: the base fetched once
    assert loaded.config.model_type == "llama"
    # without the S3 URI of the channel there is nothing to name
    proc = run_sluice(
        "train", "--train", str(corpus_dir / "train"), "--output", str(tmp / "no-uri"),
        "--pretrained", str(lora_runs["base"]),
        *sets(hp(finetune_method="lora", lora_merge="false", lora_base="reference")),
        env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 1 and "set pretrained_s3_uri" in proc.stdout + proc.stderr
    # another object at the base's URI (other weights): refused by its ETag
    other = tiny_llama(tmp / "other", lora_runs["base"], heads=2)
    moved = {k: v + 0.01 for k, v in load_file(other / "model.safetensors").items()}
    save_file(moved, other / "model.safetensors", metadata={"format": "pt"})
    with tarfile.open(tmp / "other.tar.gz", "w:gz") as tar:
        for f in other.iterdir():
            tar.add(f, arcname=f.name)
    s3 = lora_runs["server"].s3
    s3.upload_file(str(tmp / "other.tar.gz"), "sluice-data", "models/base/model.tar.gz")
    with pytest.raises(SluiceError, match="changed since the adapter was trained"):
        load_model(retrained)


@pytest.mark.slow
def test_an_unmerged_adapter_vllm_cannot_apply_is_served_from_a_merged_copy(
    tmp_path, trained, corpus_dir
):
    """vLLM has no LoRA for GPT-2: serve merges into a temporary copy instead of failing."""
    from sluice.engine import vllm_adapter
    from sluice.model import load_model, merged_copy

    out = tmp_path / "job"
    train(
        corpus_dir / "train", out, "--pretrained", str(trained["model"]),
        finetune_method="lora", lora_merge="false", max_steps=4, export_edge="false",
    )  # fmt: skip
    model_dir = out / "model"
    assert vllm_adapter(model_dir, model_dir / "adapter") is None
    copy = merged_copy(model_dir, tmp_path / "merged")
    assert not (copy / "adapter").exists() and "lora" not in read_json(copy / "config.json")
    loaded, _ = load_model(model_dir)
    plain = AutoModelForCausalLM.from_pretrained(copy)
    for name, w in plain.state_dict().items():
        assert torch.equal(w, loaded.state_dict()[name]), name
