"""FSDP (PyTorch's `fully_shard`): each process holds 1/N of the weights, gradients and AdamW
state, gathered layer by layer for the forward and backward passes, so a model that does not fit
one GPU under DDP trains across several (and across instances, from the same torchrun launch).
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("sluice.sharding")


def layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules sharded one by one: the model's repeated blocks as transformers names them
    (`_no_split_modules`: LlamaDecoderLayer, GPT2Block, ...), each gathered only while it runs."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def shard(model: torch.nn.Module, param_dtype: torch.dtype | None) -> None:
    """Shard `model` in place over every process: each block, then the rest (embeddings, final
    norm, head) as one group. `param_dtype` (bf16 on GPUs) is the dtype weights are gathered and
    computed in; gradients are reduced and AdamW steps in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    blocks = layers(model)
    if not blocks:
        log.warning("no repeated blocks found to shard one by one: the model is one FSDP unit")
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    log.info("FSDP: %d blocks sharded, %s", len(blocks), param_dtype or "float32")


def gradient_sync(model: torch.nn.Module, sync: bool) -> None:
    """Reduce-scatter gradients only on the last micro-batch of a step (as DDP's no_sync)."""
    model.set_requires_gradient_sync(sync)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0 (on CPU; an empty dict elsewhere). Every rank calls
    it: the shards are gathered one tensor at a time."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def plain_model(config, state: dict[str, torch.Tensor], adapt=None) -> torch.nn.Module:
    """An ordinary (unsharded) model holding `state`: built from `config`, through `adapt`
    (LoRA) when the trained model had adapters, so that the names match."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config).float()
    if adapt is not None:
        model = adapt(model)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = _tied_names(model)
    if unexpected or set(missing) - tied:
        raise RuntimeError(
            f"gathered weights do not fit the model: missing {missing}, unexpected {unexpected}"
        )
    return model


def _tied_names(model: torch.nn.Module) -> set[str]:
    """Parameter names that share storage with an earlier name (e.g. lm_head with the embedding)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        seen.setdefault(id(p), name)
    return tied
