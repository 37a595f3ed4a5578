"""Log-probability of texts under a causal LM, batched by a token budget, order preserved.

Shared by evaluation (the promotion gate) and the serve command's `score` task, so both report the
same numbers for the same text.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Score:
    """Sum of log-probabilities of one text's tokens (natural log), and how many were scored."""

    logprob: float
    tokens: int
    token_logprobs: list[float] | None = None

    @property
    def mean_logprob(self) -> float:
        return self.logprob / self.tokens if self.tokens else float("nan")

    @property
    def perplexity(self) -> float:
        return math.exp(-self.mean_logprob) if self.tokens else float("nan")


def windows(ids: list[int], context: int) -> list[tuple[list[int], int]]:
    """Split one sequence into model-sized windows; each token after the first is predicted once.

    Returns (window ids, index of the first predicted position inside the window): windows after
    the first start with the previous window's last token as context.
    """
    if len(ids) <= context:
        return [(ids, 1)]
    out, start = [], 0
    while start < len(ids) - 1:
        out.append((ids[start : start + context], 1))
        start += context - 1
    return out


LOGITS_BYTES = 32 * 2**20  # per micro-batch: larger logits tensors cost more in page faults


@torch.inference_mode()
def score_ids(
    model: torch.nn.Module,
    sequences: list[list[int]],
    pad_id: int,
    context: int,
    batch_tokens: int = 16384,
    per_token: bool = False,
    logits_bytes: int = LOGITS_BYTES,
    on_batch: Callable[[int, int], None] | None = None,
) -> list[Score]:
    """Score each sequence (its first id is context only); returns Scores in input order.

    Sequences are cut into windows of at most `context` tokens, windows sorted by length and run in
    micro-batches whose padded size stays within `batch_tokens` and whose float32 logits stay
    within `logits_bytes`, then summed back per sequence. `on_batch(done, total)` is called
    after each micro-batch with the windows scored so far (a progress bar's hook).
    """
    device = next(model.parameters()).device
    vocab = model.get_output_embeddings().weight.shape[0]
    batch_tokens = max(context, min(batch_tokens, logits_bytes // (4 * vocab)))
    pieces: list[tuple[int, list[int]]] = []  # (sequence index, window ids)
    for i, ids in enumerate(sequences):
        if len(ids) >= 2:
            pieces += [(i, w) for w, _ in windows(ids, context)]
    order = sorted(range(len(pieces)), key=lambda k: len(pieces[k][1]))
    totals = [0.0] * len(sequences)
    counts = [0] * len(sequences)
    per: list[list[list[float]]] = [[] for _ in sequences]
    piece_lp: dict[int, list[float]] = {}
    start = 0
    while start < len(order):
        end = start + 1
        # lengths ascend, so the last window in a batch decides its padded width
        while end < len(order) and (end - start + 1) * len(pieces[order[end]][1]) <= batch_tokens:
            end += 1
        batch = [pieces[k][1] for k in order[start:end]]
        longest = len(batch[-1])
        ids = torch.full((len(batch), longest), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for r, w in enumerate(batch):
            ids[r, : len(w)] = torch.tensor(w)
            mask[r, : len(w)] = 1
        ids, mask = ids.to(device), mask.to(device)
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float()
        # log p(target) = logit(target) - logsumexp(logits): no [batch, seq, vocab] log-softmax copy
        picked = logits.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        target = ((picked - torch.logsumexp(logits, dim=-1)) * mask[:, 1:]).cpu()
        for r, k in enumerate(order[start:end]):
            n = len(pieces[k][1]) - 1
            piece_lp[k] = target[r, :n].tolist()
        start = end
        if on_batch is not None:
            on_batch(end, len(order))
    for k, (i, _) in enumerate(pieces):
        lp = piece_lp[k]
        totals[i] += sum(lp)
        counts[i] += len(lp)
        if per_token:
            per[i].append(lp)
    return [
        Score(totals[i], counts[i], [x for part in per[i] for x in part] if per_token else None)
        for i in range(len(sequences))
    ]


def encode_for_scoring(tokenizer, texts: list[str], append_eos: bool = False) -> list[list[int]]:
    """Token ids with the BOS (or EOS) token in front, so every token of the text is predicted.

    `append_eos` also scores the end of the record, as training does (records end in EOS there).
    """
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    end = [tokenizer.eos_token_id] if append_eos and tokenizer.eos_token_id is not None else []
    enc = tokenizer(texts, add_special_tokens=False)["input_ids"]
    head = [start] if start is not None else []
    return [[*head, *ids, *end] for ids in enc]
