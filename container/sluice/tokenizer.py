"""Byte-level BPE tokenizer trained on the training channel, saved in Hugging Face's layout."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import ByteLevelBPETokenizer
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"
PAD = "<|pad|>"


def train_bpe(
    texts: Iterable[str], vocab_size: int, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a GPT-2-style byte-level BPE (no unknown tokens: every byte is in the alphabet)."""
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(
        texts, vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[EOS, PAD]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=EOS,
        pad_token=PAD,
        model_max_length=1_000_000,
    )
