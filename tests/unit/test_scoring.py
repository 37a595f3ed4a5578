import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from sluice.scoring import score_ids, windows


def test_windows_predict_every_token_once():
    ids = list(range(10))
    ws = windows(ids, 4)
    predicted = [t for w, first in ws for t in w[first:]]
    assert predicted == ids[1:]
    assert all(len(w) <= 4 for w, _ in ws)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    return GPT2LMHeadModel(cfg).eval()


def test_batched_scores_equal_one_at_a_time(model):
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 50, (n,), generator=g).tolist() for n in (2, 5, 16, 3, 40, 9)]
    batched = score_ids(model, seqs, pad_id=0, context=16, batch_tokens=64, per_token=True)
    for seq, got in zip(seqs, batched, strict=True):
        alone = score_ids(model, [seq], pad_id=0, context=16, batch_tokens=10_000)[0]
        assert got.tokens == len(seq) - 1
        assert got.logprob == pytest.approx(alone.logprob, abs=1e-4)
        assert len(got.token_logprobs) == got.tokens
        assert sum(got.token_logprobs) == pytest.approx(got.logprob, abs=1e-4)


def test_short_sequences_score_nothing(model):
    assert score_ids(model, [[1], []], pad_id=0, context=16)[0].tokens == 0
