"""The model: a GPT-2-style causal LM from size presets, or a pretrained causal LM to fine-tune."""

from __future__ import annotations

import json
import logging
import tarfile
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GPT2Config
from transformers.utils import logging as hf_logging

from .base_ref import with_base
from .errors import SluiceError
from .lora import merge_adapter, unmerged_adapter

log = logging.getLogger("sluice.model")

# Per-shard progress bars and advisory warnings drown the job's own log lines.
hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()

# Size presets (GPT-2 naming). Every field can be overridden by a hyperparameter of the same name.
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 2, "n_head": 2, "n_embd": 64, "n_positions": 256, "vocab_size": 2048},
    "small": {"n_layer": 6, "n_head": 6, "n_embd": 384, "n_positions": 512, "vocab_size": 16384},
    "base": {"n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 32768},
}
SIZE_FIELDS = ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size")
SLUICE_JSON = "sluice.json"
# Encoder families that transformers maps to a "causal LM" head only when configured as decoders;
# as plain encoders they attend to future tokens and cannot generate.
BIDIRECTIONAL = {
    "bert",
    "roberta",
    "xlm-roberta",
    "xlm-roberta-xl",
    "camembert",
    "electra",
    "ernie",
    "data2vec-text",
    "xmod",
    "rembert",
    "roc_bert",
    "megatron-bert",
    "big_bird",
    "roformer",
    "bert-generation",
    "qdqbert",
}


def size_config(cfg) -> dict[str, int]:
    """The preset's sizes with the hyperparameter overrides applied."""
    sizes = dict(PRESETS[cfg.model_size])
    for name in SIZE_FIELDS:
        if getattr(cfg, name) is not None:
            sizes[name] = getattr(cfg, name)
    if sizes["n_embd"] % sizes["n_head"]:
        raise SluiceError(f"n_embd={sizes['n_embd']} is not divisible by n_head={sizes['n_head']}")
    return sizes


def build_scratch_model(cfg, tokenizer) -> torch.nn.Module:
    """A freshly initialised GPT-2 causal LM sized by the preset and the tokenizer."""
    sizes = size_config(cfg)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=sizes["n_positions"],
        n_embd=sizes["n_embd"],
        n_layer=sizes["n_layer"],
        n_head=sizes["n_head"],
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return AutoModelForCausalLM.from_config(config)


def unpack_model_source(source: Path, scratch: Path) -> Path:
    """A model folder from a `save_pretrained` directory or a model.tar.gz of one (a channel),
    with its base fetched when it names one instead of carrying it (`base_ref`)."""
    return with_base(unpacked_model(source, scratch))


def unpacked_model(source: Path, scratch: Path) -> Path:
    """The model folder in `source` (a save_pretrained folder, one model.tar.gz unpacked into
    `scratch`, or one nested folder), as it is: a base it names is not fetched."""
    if source.is_dir():
        if (source / "config.json").exists():
            return source
        tars = sorted(source.glob("*.tar.gz"))
        if len(tars) == 1:
            source = tars[0]
        else:
            nested = [p.parent for p in source.rglob("config.json")]
            if len(nested) == 1:
                return nested[0]
            raise SluiceError(
                f"{source} holds no model: expected a save_pretrained folder (config.json) "
                "or one model.tar.gz"
            )
    if not tarfile.is_tarfile(source):
        raise SluiceError(f"{source} is neither a model folder nor a tar.gz archive")
    scratch.mkdir(parents=True, exist_ok=True)  # e.g. <work>/warm-start, new on every job
    dest = Path(tempfile.mkdtemp(prefix="model-", dir=scratch))
    with tarfile.open(source) as tar:
        tar.extractall(dest, filter="data")
    found = [p.parent for p in dest.rglob("config.json")]
    if not found:
        raise SluiceError(f"{source.name} contains no config.json: not a save_pretrained model")
    return min(found, key=lambda p: len(p.parts))


def check_causal(model_dir: Path | str) -> None:
    """Fail fast, with the reason, on a model that cannot generate (not a causal LM)."""
    try:
        config = AutoConfig.from_pretrained(model_dir)
    except Exception as e:
        raise SluiceError(f"{model_dir}: cannot read the model config ({e})") from None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    encoder = config.model_type in BIDIRECTIONAL and not getattr(config, "is_decoder", False)
    if (
        config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        or getattr(config, "is_encoder_decoder", False)
        or encoder
    ):
        raise SluiceError(
            f"{model_dir}: model type {config.model_type!r} is not a causal (decoder-only) "
            "language model (it would see future tokens or cannot generate); "
            "use one such as gpt2, llama, qwen2"
        )


def load_model(
    model_dir: Path | str,
    dtype: torch.dtype | None = None,
    attn: str | None = None,
    merge: bool = True,
):
    """Load a causal LM and its tokenizer from a folder (Hugging Face layout); an unmerged LoRA
    adapter beside the weights is merged in unless merge=False (then the base alone)."""
    model_dir = with_base(model_dir)
    check_causal(model_dir)
    kwargs = {}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if attn is not None:
        kwargs["attn_implementation"] = attn
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        adapter = unmerged_adapter(model_dir, read_sluice_json(model_dir))
        if adapter is not None and merge:
            model = merge_adapter(model, adapter)
    except SafetensorError as e:  # a truncated upload, or not safetensors at all
        raise SluiceError(
            f"{model_dir}: the weights (*.safetensors) cannot be read ({e}); the file is "
            "truncated or damaged: upload the model again"
        ) from None
    except (OSError, ValueError) as e:
        raise SluiceError(f"{model_dir}: cannot load model or tokenizer ({e})") from None
    ensure_pad_token(tokenizer)
    return model, tokenizer


def merged_copy(model_dir: Path | str, dest: Path) -> Path:
    """A plain checkpoint in `dest` of a model published with an unmerged LoRA adapter (for an
    engine that cannot apply the adapter itself): weights merged, tokenizer and settings kept."""
    model, tokenizer = load_model(model_dir)
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    return dest


def ensure_pad_token(tokenizer) -> None:
    """Batching needs a pad token; many causal LMs ship none, so reuse EOS (masked anyway)."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def fit_embeddings(model, tokenizer) -> int | None:
    """Give every token of the tokenizer an embedding row, before the first step: some
    checkpoints ship a tokenizer with tokens beyond the embedding (a pad token whose id is the
    embedding's size); without this the first batch holding one fails, after hours of training.
    New rows start at the mean of the others (transformers' default). Returns the new size, or
    None when nothing changed."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) <= rows:
        return None
    model.resize_token_embeddings(len(tokenizer))
    log.warning(
        "the tokenizer has %d tokens, the model's embedding %d rows: resized to %d (new rows "
        "start at the mean embedding)",
        len(tokenizer),
        rows,
        len(tokenizer),
    )
    return len(tokenizer)


def read_sluice_json(model_dir: Path) -> dict:
    f = Path(model_dir) / SLUICE_JSON
    return json.loads(f.read_text()) if f.exists() else {}


def write_sluice_json(model_dir: Path, info: dict) -> None:
    from .metrics import strict_json

    (Path(model_dir) / SLUICE_JSON).write_text(strict_json(info, indent=2, sort_keys=True) + "\n")


def context_length(config) -> int:
    """The longest sequence a model takes, from its config (the name varies by architecture);
    2048 when it states none."""
    for name in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    return 2048


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
