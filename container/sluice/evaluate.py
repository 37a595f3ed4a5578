"""Evaluation: the challenger and the champion scored on the same held-out records.

Per-token perplexity is only comparable between models that share a tokenizer. A model trained
from scratch on new data gets a new tokenizer, so the report also gives byte-level perplexity
(exp of the loss per UTF-8 byte), which every model can be compared on; `comparison` says which one
the gate should use.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from .model import context_length, load_model, read_sluice_json
from .scoring import encode_for_scoring, score_ids


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def evaluate_model(
    model,
    tokenizer,
    records: list[str],
    batch_tokens: int = 16384,
    on_batch: Callable[[int, int], None] | None = None,
) -> dict:
    """Loss, perplexity and byte-level perplexity of one model on a list of records."""
    model.eval()
    seqs = encode_for_scoring(tokenizer, records, append_eos=True)
    scores = score_ids(
        model,
        seqs,
        tokenizer.pad_token_id,
        context_length(model.config),
        batch_tokens,
        on_batch=on_batch,
    )
    nll = -sum(s.logprob for s in scores)
    tokens = sum(s.tokens for s in scores)
    # the EOS predicted after each record counts as one byte (the newline it stands for)
    n_bytes = sum(len(r.encode("utf-8")) + 1 for r in records)
    loss = nll / tokens
    return {
        "loss": loss,
        "perplexity": math.exp(loss),
        "tokens": tokens,
        "bytes": n_bytes,
        "records": len(records),
        "bits_per_byte": nll / n_bytes / math.log(2),
        "byte_perplexity": math.exp(nll / n_bytes),
        "tokenizer": tokenizer_fingerprint(tokenizer),
    }


def compare(challenger: dict, baseline: dict | None) -> dict:
    """Which figure the promotion gate compares, and both values (lower is better)."""
    if baseline is None:
        return {"metric": "perplexity", "challenger": challenger["perplexity"], "baseline": None}
    same = challenger["tokenizer"] == baseline["tokenizer"]
    metric = "perplexity" if same else "byte_perplexity"
    return {
        "metric": metric,
        "same_tokenizer": same,
        "challenger": challenger[metric],
        "baseline": baseline[metric],
        "improvement": 1.0 - challenger[metric] / baseline[metric],
    }


def evaluation_report(
    challenger: dict, baseline: dict | None, data_fingerprint: str, **extra
) -> dict:
    return {
        "challenger": challenger,
        "baseline": baseline,
        "comparison": compare(challenger, baseline),
        "data_fingerprint": data_fingerprint,
        **extra,
    }


def evaluate_dirs(
    model_dirs: Iterable[Path], records: list[str], device: str = "cpu", progress: bool = False
) -> dict:
    """`sluice evaluate`: score each model folder on the same records (a bar per model)."""
    from tqdm import tqdm

    out = {}
    for d in model_dirs:
        model, tok = load_model(d)
        model.to(device)
        with tqdm(desc=Path(d).name, unit="window", disable=not progress) as bar:

            def advance(done: int, total: int, bar=bar) -> None:
                bar.total = total
                bar.update(done - bar.n)

            result = evaluate_model(model, tok, records, on_batch=advance)
        result["sluice"] = read_sluice_json(Path(d)).get("name")
        out[str(d)] = result
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out
