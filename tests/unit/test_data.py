import gzip
import json
import random

import numpy as np
import pytest

from sluice.data import (
    Cleaner,
    PackedBlocks,
    channel_files,
    clean,
    is_validation,
    pack_tokens,
    prepare_text,
    read_file,
    record_hash,
)
from sluice.errors import SluiceError
from sluice.hyperparameters import TrainConfig


def cfg(**kw) -> TrainConfig:
    return TrainConfig(**kw)


def test_reads_every_format_including_gzip_and_nested(tmp_path):
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_text(json.dumps({"body": "three"}) + "\n\n")
    with gzip.open(tmp_path / "sub" / "c.csv.gz", "wt") as f:
        f.write('id,body\n1,"four, with comma"\n')
    (tmp_path / "ignored.bin").write_bytes(b"\x00")
    files = channel_files(tmp_path)
    assert [f.name for f in files] == ["a.txt", "b.jsonl", "c.csv.gz"]
    records = [r for f in files for r in read_file(f, "body", "body", "line")]
    assert [r.strip() for r in records] == ["one", "two", "three", "four, with comma"]


def test_document_mode_reads_a_file_as_one_record(tmp_path):
    (tmp_path / "doc.txt").write_text("line one\nline two\n")
    assert list(read_file(tmp_path / "doc.txt", "text", "text", "document")) == [
        "line one\nline two\n"
    ]


def test_cleaning_normalises_and_counts_what_it_drops():
    cleaner = Cleaner(min_chars=3, max_chars=20)
    raw = ["  Hello\t world  ", "Hello world", "", "   ", "ab", "x" * 25, "ﬁne ﬁsh"]
    kept = [t for t, _ in cleaner(raw)]
    assert kept == ["Hello world", "fine fish"]  # NFKC folds the ligature
    s = cleaner.stats
    assert (s.read, s.kept, s.duplicate, s.empty, s.too_short, s.too_long) == (7, 2, 1, 2, 1, 1)


def test_split_depends_on_the_record_not_its_position():
    texts = [f"record number {i}" for i in range(2000)]
    split = {t for t in texts if is_validation(record_hash(clean(t)), 0.1)}
    shuffled = texts[:]
    random.Random(3).shuffle(shuffled)
    assert {t for t in shuffled if is_validation(record_hash(clean(t)), 0.1)} == split
    assert 120 < len(split) < 280  # about 10 %


def test_validation_channel_drops_records_seen_in_training(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "val").mkdir()
    (tmp_path / "train" / "t.txt").write_text("alpha\nbeta\n")
    (tmp_path / "val" / "v.txt").write_text("beta\ngamma\n")
    prepared = prepare_text(tmp_path / "train", tmp_path / "val", cfg(), tmp_path / "work")
    assert prepared.validation_file.read_text() == "gamma\n"
    assert prepared.stats["validation"]["duplicate"] == 1


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("bad.csv", "id,body\n1,x\n", "no column 'text' in header ['id', 'body']"),
        ("bad.jsonl", '{"body": "x"}\n', "no string field 'text'"),
        ("bad2.jsonl", "{not json\n", "not valid JSON"),
        ("latin1.txt", b"caf\xe9\n", "not UTF-8"),
    ],
)
def test_bad_files_fail_with_the_file_and_the_fix(tmp_path, name, content, message):
    (tmp_path / "train").mkdir()
    path = tmp_path / "train" / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SluiceError) as e:
        prepare_text(tmp_path / "train", None, cfg(), tmp_path / "work")
    assert message in str(e.value) and name in str(e.value)


def test_empty_channel_is_an_error(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "empty.txt").write_text("\n\n")
    with pytest.raises(SluiceError, match="no usable records"):
        prepare_text(tmp_path / "train", None, cfg(), tmp_path / "work")


def test_packing_appends_eos_and_blocks_are_deterministic(tmp_path):
    from sluice.tokenizer import train_bpe

    texts = [f"the cat number {i} sat" for i in range(200)]
    tok = train_bpe(texts, 300)
    n = pack_tokens(texts, tok, tmp_path / "t.bin", tok.eos_token_id, batch=7)
    expected = sum(len(tok(t, add_special_tokens=False)["input_ids"]) + 1 for t in texts)
    assert n == expected
    blocks = PackedBlocks(tmp_path / "t.bin", 16, len(tok))
    assert len(blocks) == n // 16
    assert (blocks.tokens == tok.eos_token_id).sum() == len(texts)
    np.testing.assert_array_equal(blocks.order(1, 0), blocks.order(1, 0))
    assert not np.array_equal(blocks.order(1, 0), blocks.order(1, 1))


def test_a_huge_record_is_tokenised_piece_by_piece_with_the_same_tokens(tmp_path, monkeypatch):
    """One 3M-character record (a 50 MB one took 9 GB as one string): the tokenizer never sees
    more than a piece at a time, and the ids are those of the whole record."""
    from sluice import data
    from sluice.tokenizer import train_bpe

    rng = random.Random(0)
    words = [f"w{i}x" for i in range(300)] + ["the", "cat", "sat", "on", "mat"]
    huge = " ".join(rng.choice(words) for _ in range(600_000)) + "\nend of it"
    tok = train_bpe([huge[:20000]], 400)
    seen = []
    real_call = type(tok).__call__

    def spy(self, texts, **kw):
        seen.append((sum(map(len, texts)), max(map(len, texts))))
        return real_call(self, texts, **kw)

    monkeypatch.setattr(type(tok), "__call__", spy)
    n = pack_tokens(["short one", huge, "after"], tok, tmp_path / "t.bin", tok.eos_token_id)
    assert max(total for total, _ in seen) <= data.BATCH_CHARS + data.PIECE_CHARS
    assert max(longest for _, longest in seen) <= data.PIECE_CHARS  # never the whole record
    monkeypatch.undo()
    ids = np.memmap(tmp_path / "t.bin", dtype=data.token_dtype(len(tok)), mode="r")
    whole = [tok(t, add_special_tokens=False)["input_ids"] for t in ("short one", huge, "after")]
    expected = [t for seq in whole for t in (*seq, tok.eos_token_id)]
    assert n == len(expected)
    np.testing.assert_array_equal(ids, np.array(expected, dtype=ids.dtype))
