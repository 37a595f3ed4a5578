"""Training data: read channels, clean records, split deterministically, tokenise and pack blocks.

Everything streams. A channel is read file by file, line by line; cleaned records go to disk; token
ids are appended to a flat binary file that training memory-maps. Memory is bounded by a batch of
records plus the set of record hashes used to drop exact duplicates (8 bytes a unique record).
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import logging
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import SluiceError

log = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".jsonl", ".json", ".csv")
csv.field_size_limit(2**31 - 1)


# --- reading -------------------------------------------------------------------------------------


def _base_suffix(path: Path) -> str:
    name = path.name.lower()
    return Path(name[:-3]).suffix if name.endswith(".gz") else path.suffix.lower()


def channel_files(channel: Path) -> list[Path]:
    """Data files under a channel folder (nested folders too), in a stable order."""
    if not channel.exists():
        raise SluiceError(f"channel folder {channel} does not exist")
    if channel.is_file():
        return [channel]
    files = [
        p
        for p in sorted(channel.rglob("*"))
        if p.is_file() and _base_suffix(p) in TEXT_SUFFIXES and not p.name.startswith(".")
    ]
    return files


def _open_text(path: Path) -> io.TextIOBase:
    raw = gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")  # noqa: SIM115
    # strict decoding: undecodable bytes are an error with the file's name, not silent mojibake
    return io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline=None)


def read_file(path: Path, text_field: str, text_column: str, txt_mode: str) -> Iterator[str]:
    """Yield the raw text records of one file (.txt, .jsonl, .csv, optionally gzip-compressed)."""
    suffix = _base_suffix(path)
    try:
        with _open_text(path) as f:
            if suffix == ".txt":
                if txt_mode == "document":
                    yield f.read()
                else:
                    for line in f:
                        yield line
            elif suffix in (".jsonl", ".json"):
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise SluiceError(
                            f"{path.name} line {n}: not valid JSON ({e.msg})"
                        ) from None
                    value = obj.get(text_field) if isinstance(obj, dict) else None
                    if not isinstance(value, str):
                        raise SluiceError(
                            f"{path.name} line {n}: no string field {text_field!r} "
                            "(set the text_field hyperparameter)"
                        )
                    yield value
            else:  # .csv with a header
                reader = csv.DictReader(f)
                if reader.fieldnames is None or text_column not in reader.fieldnames:
                    raise SluiceError(
                        f"{path.name}: no column {text_column!r} in header "
                        f"{reader.fieldnames or []} (set the text_column hyperparameter)"
                    )
                for row in reader:
                    yield row[text_column] or ""
    except UnicodeDecodeError as e:
        raise SluiceError(
            f"{path.name}: bytes at offset {e.start} are not UTF-8; re-encode the file as UTF-8"
        ) from None
    except (OSError, EOFError) as e:
        raise SluiceError(f"{path.name}: cannot be read ({e})") from None


# --- cleaning and splitting -----------------------------------------------------------------------


def clean(text: str) -> str:
    """NFKC-normalise and collapse every run of whitespace to one space."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def record_hash(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()


def is_validation(h: bytes, fraction: float) -> bool:
    """Deterministic split on the record's own hash: the same record always lands on one side."""
    return int.from_bytes(h, "big") % 1_000_000 < fraction * 1_000_000


@dataclass
class CleanStats:
    read: int = 0
    kept: int = 0
    empty: int = 0
    duplicate: int = 0
    too_short: int = 0
    too_long: int = 0
    files: int = 0
    # order-independent content fingerprint: sum of record hashes modulo 2**64
    fingerprint_sum: int = 0

    def as_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "fingerprint_sum"}
        d["fingerprint"] = f"{self.fingerprint_sum:016x}-{self.kept}"
        return d


@dataclass
class Cleaner:
    """Cleans a stream of records and drops empty, duplicate, too-short and too-long ones."""

    min_chars: int = 1
    max_chars: int = 0
    stats: CleanStats = field(default_factory=CleanStats)
    _seen: set[bytes] = field(default_factory=set)

    def __call__(self, records: Iterable[str]) -> Iterator[tuple[str, bytes]]:
        for raw in records:
            self.stats.read += 1
            text = clean(raw)
            if not text:
                self.stats.empty += 1
                continue
            if len(text) < self.min_chars:
                self.stats.too_short += 1
                continue
            if self.max_chars and len(text) > self.max_chars:
                self.stats.too_long += 1
                continue
            h = record_hash(text)
            if h in self._seen:
                self.stats.duplicate += 1
                continue
            self._seen.add(h)
            self.stats.kept += 1
            self.stats.fingerprint_sum = (self.stats.fingerprint_sum + int.from_bytes(h, "big")) % (
                2**64
            )
            yield text, h


def iter_channel(channel: Path, cfg, cleaner: Cleaner) -> Iterator[tuple[str, bytes]]:
    files = channel_files(channel)
    for path in files:
        cleaner.stats.files += 1
        yield from cleaner(read_file(path, cfg.text_field, cfg.text_column, cfg.txt_mode))


@dataclass
class PreparedText:
    """Cleaned records on disk, one per line: what the tokenizer trains on and packing reads."""

    train_file: Path
    validation_file: Path
    train_records: int
    validation_records: int
    stats: dict


def prepare_text(train: Path, validation: Path | None, cfg, work: Path) -> PreparedText:
    """Clean the channels into work/train.txt and work/validation.txt (one record a line)."""
    work.mkdir(parents=True, exist_ok=True)
    train_out, val_out = work / "train.txt", work / "validation.txt"
    cleaner = Cleaner(cfg.min_chars, cfg.max_chars)
    n_train = n_val = 0
    with open(train_out, "w", encoding="utf-8") as tf, open(val_out, "w", encoding="utf-8") as vf:
        for text, h in iter_channel(train, cfg, cleaner):
            if validation is None and is_validation(h, cfg.validation_fraction):
                vf.write(text + "\n")
                n_val += 1
            else:
                tf.write(text + "\n")
                n_train += 1
        train_stats = cleaner.stats.as_dict()
        val_stats = None
        if validation is not None:
            # held-out records seen in training would flatter the model: drop them from validation
            vcleaner = Cleaner(cfg.min_chars, cfg.max_chars, _seen=set(cleaner._seen))
            for text, _ in iter_channel(validation, cfg, vcleaner):
                vf.write(text + "\n")
                n_val += 1
            val_stats = vcleaner.stats.as_dict()
    if n_train == 0:
        raise SluiceError(
            f"training channel {train} has no usable records "
            f"({train_stats['files']} files, {train_stats['read']} records read, "
            f"{train_stats['empty']} empty, {train_stats['duplicate']} duplicates)"
        )
    if n_val == 0:
        raise SluiceError(
            "no validation records: add a validation channel or raise validation_fraction "
            f"(training has {n_train} records)"
        )
    stats = {"train": train_stats, "validation": val_stats or {"split_from_train": n_val}}
    log.info("cleaned data: %s", json.dumps(stats))
    return PreparedText(train_out, val_out, n_train, n_val, stats)


def read_lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")


# --- tokenising and packing -----------------------------------------------------------------------


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


PIECE_CHARS = 1 << 18  # a record longer than this is tokenised a piece at a time
BATCH_CHARS = 1 << 20  # text handed to the tokenizer at once (~190 bytes of memory a char)


def pieces(text: str, limit: int = PIECE_CHARS) -> list[str]:
    """`text` cut into pieces of at most `limit` characters, each cut just before whitespace
    (where byte-level BPE starts a new word anyway), so the tokens come out as for the whole."""
    out = []
    while len(text) > limit:
        cut = max(text.rfind(" ", 0, limit), text.rfind("\n", 0, limit))
        cut = cut if cut > 0 else limit  # one "word" longer than the limit: cut it anyway
        out.append(text[:cut])
        text = text[cut:]
    out.append(text)
    return out


def pack_tokens(lines: Iterable[str], tokenizer, out: Path, eos_id: int, batch: int = 1000) -> int:
    """Tokenise records in batches and append ids (each record ending in EOS) to a flat file.

    Memory stays bounded whatever the records: a batch is at most `batch` pieces and about
    BATCH_CHARS characters, and a record longer than PIECE_CHARS is tokenised piece by piece (a
    fast tokenizer's offsets and encodings for one 50 MB string took 9 GB)."""
    dtype = token_dtype(len(tokenizer))
    total = 0
    buf: list[str] = []
    ends: list[bool] = []  # whether each piece ends its record (EOS after it)
    chars = 0
    with open(out, "wb") as f:

        def flush() -> None:
            nonlocal total, chars
            ids = tokenizer(buf, add_special_tokens=False)["input_ids"]
            flat = np.fromiter(
                (t for seq, end in zip(ids, ends, strict=True) for t in (*seq, *[eos_id] * end)),
                dtype=dtype,
                count=sum(map(len, ids)) + sum(ends),
            )
            f.write(flat.tobytes())
            total += len(flat)
            buf.clear()
            ends.clear()
            chars = 0

        for line in lines:
            parts = pieces(line)
            for i, part in enumerate(parts):
                buf.append(part)
                ends.append(i == len(parts) - 1)
                chars += len(part)
                if len(buf) >= batch or chars >= BATCH_CHARS:
                    flush()
        if buf:
            flush()
    return total


class PackedBlocks:
    """Fixed-length blocks over a memory-mapped token file; the order is a function of the seed."""

    def __init__(self, path: Path, block_size: int, vocab_size: int):
        self.tokens = np.memmap(path, dtype=token_dtype(vocab_size), mode="r")
        self.block_size = block_size
        self.n_blocks = len(self.tokens) // block_size

    def __len__(self) -> int:
        return self.n_blocks

    def block(self, i: int) -> np.ndarray:
        start = i * self.block_size
        return np.asarray(self.tokens[start : start + self.block_size], dtype=np.int64)

    def order(self, seed: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([seed, epoch]).permutation(self.n_blocks)
