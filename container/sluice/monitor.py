"""Drift statistics for text, in Model Monitor's file formats: `sluice monitor`.

Baseline mode reads the champion's training data and writes `statistics.json` and suggested
`constraints.json`. Monitor mode reads a window of traffic (endpoint or batch data capture, or
plain JSON Lines/text) and writes `statistics.json`, `constraint_violations.json`
(`baseline_drift_check` entries reading `distance: X exceeds threshold: Y`), CloudWatch metric
lines, `report.md` with plots, and the completion message.

Measures, each a distance from the baseline with a threshold in the constraints:
- token_distribution: Jensen-Shannon distance (base 2, 0..1) of tokenizer-id frequencies;
- record_length: population stability index of tokens per record, on the baseline's deciles;
- byte_fallback_rate: share of tokens that are single bytes (text the tokenizer never learnt
  splits into bytes), as an absolute difference;
- script_mix: Jensen-Shannon distance of character classes (letters by script, digits, ...);
- output_length, output_mean_logprob: PSI of generated length and mean log-probability, against
  the champion's own generations for REFERENCE_OUTPUTS training prompts (made by the baseline).

A violation needs the distance to exceed both the constraint (an effect size chosen a priori: PSI
0.25 is the customary "significant shift" bound; JS distance 0.1; 5 points of byte fallback) and
what sampling noise alone gives at this window's size. The baseline measures that noise on its own
records: for subsets of 25..5000 records it keeps the largest distance of NOISE_DRAWS random
subsets from the whole; a window's bound is NOISE_MARGIN times that, interpolated to its size.
Records are drawn whole, so tokens that travel together within a record count as they do in real
traffic. So a small window of unchanged traffic does not trip a bound meant for large ones.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import itertools
import json
import math
import os
import unicodedata
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from .errors import SluiceError

VERSION = 0.0
NOISE_DRAWS = 20
DEFAULT_THRESHOLDS = {
    "token_distribution": ("jensen_shannon", 0.1),
    "record_length": ("psi", 0.25),
    "byte_fallback_rate": ("absolute", 0.05),
    "script_mix": ("jensen_shannon", 0.1),
    "output_length": ("psi", 0.25),
    "output_mean_logprob": ("psi", 0.25),
}
MIN_RECORDS = 100  # below this the noise bound exceeds the effect sizes anyway
TEXT_FIELDS = ("text", "inputs")  # as the serving contract reads records


# --- reading a window ------------------------------------------------------------------------


@dataclass
class Window:
    """What a folder of inputs holds: request texts, model outputs, and what could not be read."""

    texts: list[str] = field(default_factory=list)
    outputs: list[dict] = field(default_factory=list)
    malformed: int = 0
    files: int = 0


def _decode(part: dict) -> bytes:
    data, encoding = part.get("data", ""), (part.get("encoding") or "JSON").upper()
    if encoding == "BASE64":
        return base64.b64decode(data, validate=True)
    return data.encode() if isinstance(data, str) else json.dumps(data).encode()


def _request_texts(body: bytes, content_type: str | None) -> list[str]:
    from .records import Defaults, Record, parse_body

    return [r.text for r in parse_body(body, content_type, Defaults()) if isinstance(r, Record)]


def _output_rows(body: bytes) -> list[dict]:
    rows = []
    for line in body.splitlines():
        if line.strip():
            obj = json.loads(line)
            if isinstance(obj, dict) and "error" not in obj:
                rows.append(obj)
    return rows


def add_line(window: Window, line: str) -> None:
    """One line of a capture file, a JSON Lines/text input or a transform's .out file (batch
    capture names the job's inputs and outputs); a bad line is counted, not fatal."""
    line = line.strip()
    if not line:
        return
    if not line.startswith("{"):
        window.texts.append(line)
        return
    try:
        obj = json.loads(line)
        capture = obj.get("captureData")
        if isinstance(capture, dict):
            inp, out = capture.get("endpointInput"), capture.get("endpointOutput")
            if inp:
                window.texts += _request_texts(_decode(inp), inp.get("observedContentType"))
            if out:
                window.outputs += _output_rows(_decode(out))
            return
        text = next((obj[k] for k in TEXT_FIELDS if isinstance(obj.get(k), str)), None)
        if text is None:
            if isinstance(obj.get("error"), dict):
                return  # a transform output's error line: neither a request nor an answer
            if "task" in obj:
                window.outputs.append(obj)  # a transform output line (.out): the model's answer
                return
            raise ValueError("no text field")
        window.texts.append(text)
    except (ValueError, AttributeError, TypeError, binascii.Error, UnicodeDecodeError):
        # json.JSONDecodeError and records.BodyError are ValueErrors too
        window.malformed += 1


def read_window(paths: list[Path], max_records: int | None = None) -> Window:
    """Every record under `paths` (files sorted), or the first `max_records` of them."""
    window = Window()
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            if path.name.startswith(".") or path.suffix in (".md", ".png"):
                continue
            window.files += 1
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt", encoding="utf-8", errors="replace") as f:
                for line in f:
                    add_line(window, line)
                    if max_records and len(window.texts) >= max_records:
                        del window.texts[max_records:]
                        return window
    return window


# --- statistics --------------------------------------------------------------------------------


def char_class(ch: str) -> str:
    if ch.isspace():
        return "space"
    cat = unicodedata.category(ch)
    if cat[0] == "L":
        name = unicodedata.name(ch, "")
        return "letter:" + (name.split(" ")[0].lower() if name else "other")
    return {"N": "digit", "P": "punctuation", "S": "symbol"}.get(cat[0], "other")


def byte_token_ids(tokenizer) -> set[int]:
    """Ids of single-byte tokens (byte-level BPE's alphabet) and the unknown token."""
    ids = {i for tok, i in tokenizer.get_vocab().items() if len(tok) == 1}
    if tokenizer.unk_token_id is not None:
        ids.add(tokenizer.unk_token_id)
    return ids


def _quantile_edges(values: list[int], bins: int = 10) -> list[float]:
    if not values:
        return []
    qs = np.quantile(np.asarray(values, dtype=float), np.linspace(0, 1, bins + 1)[1:-1])
    return sorted(set(float(q) for q in qs))


def _binned(values: list[float], edges: list[float]) -> list[int]:
    idx = np.searchsorted(np.asarray(edges), np.asarray(values, dtype=float), side="right")
    return np.bincount(idx, minlength=len(edges) + 1).tolist()


@dataclass
class Rows:
    """Per-record measurements of a window, so any subset can be aggregated cheaply."""

    ids: list[np.ndarray]
    fallback: np.ndarray
    chars: list[np.ndarray]  # character-class ids per record
    classes: list[str]
    out_len: np.ndarray
    out_lp: np.ndarray


def measure_rows(window: Window, tokenizer) -> Rows:
    byte_ids = np.asarray(sorted(byte_token_ids(tokenizer)))
    enc = tokenizer(window.texts, add_special_tokens=False)["input_ids"] if window.texts else []
    ids = [np.asarray(r, dtype=np.int64) for r in enc]
    classes: dict[str, int] = {}
    chars = [
        np.asarray([classes.setdefault(char_class(c), len(classes)) for c in t], dtype=np.int64)
        for t in window.texts
    ]

    def numbers(key: str) -> np.ndarray:
        return np.asarray(
            [float(r[key]) for r in window.outputs if isinstance(r.get(key), int | float)],
            dtype=float,
        )

    return Rows(
        ids,
        np.asarray([int(np.isin(r, byte_ids).sum()) for r in ids], dtype=np.int64),
        chars,
        list(classes),
        numbers("tokens"),
        numbers("mean_logprob"),
    )


def _counts(arrays: list[np.ndarray], idx) -> np.ndarray:
    picked = [arrays[i] for i in idx]
    return np.bincount(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)


def _numeric(values: np.ndarray, edges: list[float] | None) -> dict:
    e = edges if edges is not None else _quantile_edges(values.tolist())
    return {
        "count": len(values),
        "mean": float(values.mean()),
        "min": float(values.min()),
        "max": float(values.max()),
        "bin_edges": e,
        "bin_counts": _binned(values.tolist(), e),
    }


INPUT_MEASURES = ("token_distribution", "record_length", "byte_fallback_rate", "script_mix")
OUTPUT_MEASURES = ("output_length", "output_mean_logprob")


def feature(name: str, rows: Rows, edges: dict, idx=None) -> dict | None:
    """One measure over the records `idx` (all by default); None when the window has no data."""
    n = len(rows.ids) if name in INPUT_MEASURES else len(rows.out_len)
    idx = np.arange(n) if idx is None else idx
    if name == "token_distribution":
        c = _counts(rows.ids, idx)
        counts = {str(k): int(v) for k, v in enumerate(c) if v}
        return {
            "name": name,
            "inferred_type": "Distribution",
            "distribution": {"total": int(c.sum()), "counts": counts},
        }
    if name == "script_mix":
        c = _counts(rows.chars, idx)
        counts = {rows.classes[k]: int(v) for k, v in enumerate(c) if v}
        return {
            "name": name,
            "inferred_type": "Distribution",
            "distribution": {"total": int(c.sum()), "counts": counts},
        }
    if name == "byte_fallback_rate":
        total = int(sum(len(rows.ids[i]) for i in idx))
        fb = int(rows.fallback[idx].sum()) if len(idx) else 0
        return {
            "name": name,
            "inferred_type": "Fractional",
            "rate": {"tokens": total, "byte_tokens": fb, "value": fb / total if total else 0.0},
        }
    if name == "record_length":
        values = np.asarray([len(rows.ids[i]) for i in idx], dtype=float)
    else:
        column = rows.out_len if name == "output_length" else rows.out_lp
        values = column[idx] if len(column) == n else column
    if not len(values):
        return None
    return {
        "name": name,
        "inferred_type": "Fractional",
        "numerical_statistics": _numeric(values, edges.get(name)),
    }


def statistics(
    window: Window,
    tokenizer,
    fingerprint: str,
    edges: dict | None = None,
    calibrate: bool = False,
    seed: int = 0,
) -> dict:
    """Model Monitor-style statistics of one window (bins from `edges`, else its own deciles).

    With `calibrate` (baselines), also how far random subsets of these very records fall from the
    whole, per measure and subset size: the sampling noise a window of that size shows unchanged.
    """
    rows = measure_rows(window, tokenizer)
    edges = dict(edges or {})
    features = []
    for name in INPUT_MEASURES + OUTPUT_MEASURES:
        f = feature(name, rows, edges)
        if f is not None:
            features.append(f)
            if "numerical_statistics" in f:
                edges[name] = f["numerical_statistics"]["bin_edges"]
    stats = {
        "version": VERSION,
        "dataset": {
            "item_count": len(window.texts),
            "outputs": len(window.outputs),
            "malformed": window.malformed,
            "files": window.files,
        },
        "tokenizer": fingerprint,
        "features": features,
    }
    if calibrate:
        stats["calibration"] = calibration(rows, features, edges, seed)
    return stats


CALIBRATION_SIZES = (25, 50, 100, 200, 500, 1000, 2000, 5000)
NOISE_MARGIN = 1.5  # over the largest of NOISE_DRAWS draws (about their 95th percentile)


def calibration(rows: Rows, features: list[dict], edges: dict, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    table: dict[str, dict[str, float]] = {}
    for base in features:
        name = base["name"]
        method = DEFAULT_THRESHOLDS[name][0]
        total = len(rows.ids) if name in INPUT_MEASURES else len(rows.out_len)
        for n in (n for n in CALIBRATION_SIZES if n <= total // 2):
            worst = 0.0
            for _ in range(NOISE_DRAWS):
                sub = feature(name, rows, edges, rng.choice(total, n, replace=False))
                d = distance(method, base, sub) if sub else None
                worst = max(worst, d or 0.0)
            table.setdefault(name, {})[str(n)] = worst
    return {"draws": NOISE_DRAWS, "margin": NOISE_MARGIN, "max_distance": table}


def noise_at(calibration: dict | None, name: str, n: int) -> float:
    """Sampling-noise bound for a window of n records (interpolated, ~1/sqrt(n) outside)."""
    table = ((calibration or {}).get("max_distance") or {}).get(name)
    if not table or n <= 0:
        return 0.0
    sizes = sorted((int(k), v) for k, v in table.items())
    if n <= sizes[0][0]:
        value = sizes[0][1] * math.sqrt(sizes[0][0] / n)
    elif n >= sizes[-1][0]:
        value = sizes[-1][1] * math.sqrt(sizes[-1][0] / n)
    else:
        (a, va), (b, vb) = next(p for p in itertools.pairwise(sizes) if p[0][0] <= n <= p[1][0])
        t = (math.log(n) - math.log(a)) / (math.log(b) - math.log(a))
        value = math.exp((1 - t) * math.log(max(va, 1e-9)) + t * math.log(max(vb, 1e-9)))
    return calibration.get("margin", NOISE_MARGIN) * value


def suggest_constraints(stats: dict) -> dict:
    """constraints.json for a baseline: one drift check per measure the baseline supports."""
    names = {f["name"] for f in stats["features"]}
    features = [
        {
            "name": name,
            "inferred_type": "Distribution" if method == "jensen_shannon" else "Fractional",
            "drift_check": {"method": method, "threshold": threshold},
        }
        for name, (method, threshold) in DEFAULT_THRESHOLDS.items()
        if name in names
    ]
    return {
        "version": VERSION,
        "tokenizer": stats["tokenizer"],
        "monitoring_config": {
            "min_records": MIN_RECORDS,
            "distribution_constraints": {"perform_comparison": "Enabled"},
        },
        "features": features,
    }


# --- distances ---------------------------------------------------------------------------------


def js_distance(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon distance (sqrt of the base-2 divergence): 0 same, 1 disjoint."""
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(a):
        nz = a > 0
        return float(np.sum(a[nz] * np.log2(a[nz] / m[nz])))

    return math.sqrt(max(0.0, (kl(p) + kl(q)) / 2))


def psi(base: np.ndarray, cur: np.ndarray, eps: float = 1e-4) -> float:
    """Population stability index over shared bins."""
    b = np.maximum(base / base.sum(), eps)
    c = np.maximum(cur / cur.sum(), eps)
    return float(np.sum((c - b) * np.log(c / b)))


def _feature(stats: dict, name: str) -> dict | None:
    return next((f for f in stats["features"] if f["name"] == name), None)


def _aligned(base: dict, cur: dict) -> tuple[np.ndarray, np.ndarray]:
    keys = sorted(set(base) | set(cur))
    return (
        np.array([base.get(k, 0) for k in keys], dtype=float),
        np.array([cur.get(k, 0) for k in keys], dtype=float),
    )


def distance(method: str, base: dict, cur: dict) -> float | None:
    """How far `cur` is from `base` by `method`; None when either side has no data."""
    if method == "jensen_shannon":
        b, c = _aligned(base["distribution"]["counts"], cur["distribution"]["counts"])
        return js_distance(b, c) if b.sum() and c.sum() else None
    if method == "psi":
        b = np.asarray(base["numerical_statistics"]["bin_counts"], dtype=float)
        c = np.asarray(cur["numerical_statistics"]["bin_counts"], dtype=float)
        return psi(b, c) if b.sum() and c.sum() and len(b) == len(c) else None
    if method == "absolute":
        rb, rc = base["rate"], cur["rate"]
        return abs(rc["value"] - rb["value"]) if rb["tokens"] and rc["tokens"] else None
    raise SluiceError(f"unknown drift check method {method!r}")


def compare(baseline: dict, constraints: dict, current: dict) -> dict:
    """constraint_violations.json, plus each measure's figures (kept in the report)."""
    if constraints.get("tokenizer") and current["tokenizer"] != constraints["tokenizer"]:
        raise SluiceError(
            "the window was tokenized with another tokenizer than the baseline's: rebuild the "
            "baseline for the current champion (sluice monitor baseline)"
        )
    min_records = constraints.get("monitoring_config", {}).get("min_records", MIN_RECORDS)
    checks, violations = [], []
    enough = current["dataset"]["item_count"] >= min_records
    for c in constraints["features"]:
        name, check = c["name"], c["drift_check"]
        base, cur = _feature(baseline, name), _feature(current, name)
        if not enough or base is None or cur is None:
            continue
        d = distance(check["method"], base, cur)
        if d is None:
            continue
        n = current["dataset"]["item_count" if name in INPUT_MEASURES else "outputs"]
        noise = noise_at(baseline.get("calibration"), name, n)
        threshold = max(check["threshold"], noise)
        checks.append(
            {
                "feature_name": name,
                "method": check["method"],
                "distance": d,
                "threshold": threshold,
                "constraint": check["threshold"],
                "sampling_noise": noise,
            }
        )
        if d > threshold:
            violations.append(
                {
                    "feature_name": name,
                    "constraint_check_type": "baseline_drift_check",
                    "description": f"distance: {d:.4f} exceeds threshold: {threshold:.4f}",
                }
            )
    note = (
        None
        if enough
        else (
            f"window has {current['dataset']['item_count']} records, fewer than min_records "
            f"{min_records}: no drift checks"
        )
    )
    return {"violations": violations, "checks": checks, "note": note}


# --- report ------------------------------------------------------------------------------------


def _plot(baseline: dict, current: dict, out: Path, tokenizer) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    for name, top in (("token_distribution", 30), ("script_mix", 12)):
        b, c = _feature(baseline, name), _feature(current, name)
        if not b or not c:
            continue
        bc, cc = b["distribution"]["counts"], c["distribution"]["counts"]
        bt, ct = max(sum(bc.values()), 1), max(sum(cc.values()), 1)
        keys = sorted(set(bc) | set(cc), key=lambda k: -(bc.get(k, 0) / bt + cc.get(k, 0) / ct))
        keys = keys[:top]
        labels = [
            tokenizer.convert_ids_to_tokens(int(k)) if name == "token_distribution" else k
            for k in keys
        ]
        x = np.arange(len(keys))
        fig, ax = plt.subplots(figsize=(10, 3.5))
        ax.bar(x - 0.2, [bc.get(k, 0) / bt for k in keys], 0.4, label="baseline")
        ax.bar(x + 0.2, [cc.get(k, 0) / ct for k in keys], 0.4, label="current")
        ax.set_xticks(x, labels, rotation=70, fontsize=7)
        ax.set_title(f"{name}: most frequent in either")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=90)
        plt.close(fig)
        made.append(f"{name}.png")
    for name in ("record_length", "output_length", "output_mean_logprob"):
        b, c = _feature(baseline, name), _feature(current, name)
        if not b or not c:
            continue
        bb, cb = (np.asarray(f["numerical_statistics"]["bin_counts"], dtype=float) for f in (b, c))
        if len(bb) != len(cb):
            continue
        x = np.arange(len(bb))
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.bar(x - 0.2, bb / max(bb.sum(), 1), 0.4, label="baseline")
        ax.bar(x + 0.2, cb / max(cb.sum(), 1), 0.4, label="current")
        ax.set_xlabel("baseline decile bin")
        ax.set_title(name)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=90)
        plt.close(fig)
        made.append(f"{name}.png")
    return made


def write_report(out: Path, result: dict, current: dict, plots: list[str]) -> Path:
    lines = ["# Sluice drift report", ""]
    d = current["dataset"]
    lines.append(
        f"Window: {d['item_count']} records, {d['outputs']} outputs, {d['files']} files, "
        f"{d['malformed']} malformed lines skipped."
    )
    lines += [
        "",
        f"**{len(result['violations'])} violation(s)**"
        if result["violations"]
        else "**No violations.**",
        "",
    ]
    if result.get("note"):
        lines += [f"Note: {result['note']}", ""]
    lines += [
        "| measure | method | distance | threshold | constraint | sampling noise | drift |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    flagged = {v["feature_name"] for v in result["violations"]}
    for c in result["checks"]:
        lines.append(
            f"| {c['feature_name']} | {c['method']} | {c['distance']:.4f} | "
            f"{c['threshold']:.4f} | {c['constraint']:.4f} | {c['sampling_noise']:.4f} | "
            f"{'**yes**' if c['feature_name'] in flagged else 'no'} |"
        )
    lines.append("")
    lines += [f"![{p}]({p})" for p in plots]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


# --- the command ------------------------------------------------------------------------------


def model_source(model: Path, scratch: Path) -> Path:
    """A folder with a tokenizer: a model folder, a model.tar.gz unpacked once, or a baseline's
    tokenizer/ folder."""
    from .model import unpack_model_source

    if model.is_dir() and (model / "tokenizer_config.json").exists():
        return model
    scratch.mkdir(parents=True, exist_ok=True)
    return unpack_model_source(model, scratch)


def load_tokenizer(model: Path, scratch: Path):
    """The tokenizer (and its fingerprint) of anything model_source accepts."""
    from transformers import AutoTokenizer

    from .evaluate import tokenizer_fingerprint

    tok = AutoTokenizer.from_pretrained(str(model_source(model, scratch)))
    return tok, tokenizer_fingerprint(tok)


def _write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")


BASELINE_MAX_RECORDS = 200_000  # enough for stable statistics; bounds the job's memory


REFERENCE_OUTPUTS = 200


def reference_outputs(model_dir: Path, texts: list[str], n: int) -> list[dict]:
    """What the champion generates, greedily, for the first n records' opening halves (up to 32
    tokens), with its own default max_new_tokens: the baseline for the output-side measures.

    Hugging Face `generate` rather than vLLM: for a few hundred short prompts in a processing job,
    vLLM's start-up (tens of seconds) costs more than the generation. Greedy float32 text is the
    same in both; tokens and mean_logprob are counted as `serve` counts them (EOS excluded).
    """
    import torch

    from .model import load_model, read_sluice_json

    model, tok = load_model(model_dir)
    model.eval()
    defaults = read_sluice_json(model_dir).get("task_defaults", {})
    max_new = int(defaults.get("max_new_tokens", 32))
    prompts = []
    for text in texts[:n]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= 2:
            prompts.append(ids[: min(32, len(ids) // 2)])
    out: list[dict] = []
    tok.padding_side = "left"
    for start in range(0, len(prompts), 64):
        batch = tok.pad({"input_ids": prompts[start : start + 64]}, return_tensors="pt")
        with torch.inference_mode():
            gen = model.generate(
                **batch,
                max_new_tokens=max_new,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                return_dict_in_generate=True,
                output_scores=True,
            )
        steps = torch.stack(gen.scores, dim=1).float().log_softmax(-1)  # [rows, steps, vocab]
        new = gen.sequences[:, batch["input_ids"].shape[1] :]
        for row in range(new.shape[0]):
            ids, logps = [], []
            for t, token in enumerate(new[row].tolist()):
                if token == tok.eos_token_id:
                    break
                ids.append(token)
                logps.append(float(steps[row, t, token]))
            out.append(
                {
                    "task": "generate",
                    "generated_text": tok.decode(ids, skip_special_tokens=True),
                    "tokens": len(ids),
                    "mean_logprob": sum(logps) / len(logps) if logps else None,
                }
            )
    return out


def run_baseline(
    data: list[Path],
    model: Path,
    output: Path,
    max_records: int = BASELINE_MAX_RECORDS,
    outputs: int = REFERENCE_OUTPUTS,
) -> dict:
    """statistics.json, constraints.json and tokenizer/ for a champion and its training data;
    with a full model (not just a tokenizer) also its outputs on `outputs` training prompts."""
    source = model_source(model, output / ".model")  # a model.tar.gz is unpacked once
    tok, fp = load_tokenizer(source, output / ".model")
    window = read_window(data, max_records)
    if not window.texts:
        raise SluiceError(f"no records in {', '.join(map(str, data))} to build a baseline from")
    if outputs and not window.outputs and (source / "config.json").exists():
        window.outputs = reference_outputs(source, window.texts, outputs)
    stats = statistics(window, tok, fp, calibrate=True)
    # the tokenizer travels with the baseline: monitor jobs then need no model archive
    tok.save_pretrained(str(output / "tokenizer"))
    _write_json(output / "statistics.json", stats)
    _write_json(output / "constraints.json", suggest_constraints(stats))
    return stats


@dataclass
class MonitorEnv:
    """Model Monitor's bring-your-own-container contract (its environment variables)."""

    dataset_source: Path
    output_path: Path
    baseline_statistics: Path
    baseline_constraints: Path
    publish_metrics: bool
    endpoint: str | None
    schedule: str | None
    start_time: str | None
    end_time: str | None
    metrics_dir: Path

    @classmethod
    def from_env(cls, env: dict[str, str]) -> MonitorEnv:
        missing = [
            k
            for k in (
                "dataset_source",
                "output_path",
                "baseline_statistics",
                "baseline_constraints",
            )
            if not env.get(k)
        ]
        if missing:
            raise SluiceError(f"monitor needs the environment variables {', '.join(missing)}")
        return cls(
            Path(env["dataset_source"]),
            Path(env["output_path"]),
            Path(env["baseline_statistics"]),
            Path(env["baseline_constraints"]),
            env.get("publish_cloudwatch_metrics", "Disabled") == "Enabled",
            env.get("endpoint_name"),
            env.get("monitoring_schedule_name"),
            env.get("start_time"),
            env.get("end_time"),
            Path(env.get("SLUICE_METRICS_DIR", "/opt/ml/output/metrics/cloudwatch")),
        )


def metric_lines(result: dict, endpoint: str | None, schedule: str | None, now: datetime) -> list:
    """CloudWatch metrics as Model Monitor's BYOC containers write them (one JSON per line)."""
    dims = [
        {"Name": "Endpoint", "Value": endpoint or "batch"},
        {"Name": "MonitoringSchedule", "Value": schedule or "sluice"},
    ]
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    rows = [
        {
            "MetricName": f"feature_baseline_drift_{c['feature_name']}",
            "Timestamp": stamp,
            "Dimensions": dims,
            "Value": c["distance"],
            "Unit": "None",
        }
        for c in result["checks"]
    ]
    rows.append(
        {
            "MetricName": "violations",
            "Timestamp": stamp,
            "Dimensions": dims,
            "Value": len(result["violations"]),
            "Unit": "Count",
        }
    )
    return rows


def run_monitor(
    data: list[Path],
    baseline_statistics: Path,
    baseline_constraints: Path,
    model: Path,
    output: Path,
    *,
    metrics_dir: Path | None = None,
    endpoint: str | None = None,
    schedule: str | None = None,
    message_file: Path | None = None,
) -> dict:
    """Compare a window with the baseline; write every output; return the violations document."""
    try:
        baseline = json.loads(baseline_statistics.read_text())
        constraints = json.loads(baseline_constraints.read_text())
    except (OSError, ValueError) as e:
        raise SluiceError(f"cannot read the baseline: {e}") from None
    tok, fp = load_tokenizer(model, output / ".model")
    window = read_window(data)
    edges = {
        f["name"]: f["numerical_statistics"]["bin_edges"]
        for f in baseline["features"]
        if "numerical_statistics" in f
    }
    current = statistics(window, tok, fp, edges)
    result = compare(baseline, constraints, current)
    _write_json(output / "statistics.json", current)
    _write_json(output / "constraint_violations.json", {"violations": result["violations"]})
    plots = _plot(baseline, current, output, tok)
    write_report(output, result, current, plots)
    if metrics_dir is not None:
        metrics_dir.mkdir(parents=True, exist_ok=True)
        rows = metric_lines(result, endpoint, schedule, datetime.now(UTC))
        (metrics_dir / "sluice-drift.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    n = len(result["violations"])
    message = (
        (
            f"CompletedWithViolations: {n} violation(s): "
            + ", ".join(v["feature_name"] for v in result["violations"])
        )
        if n
        else (f"Completed: no violations ({result['note'] or 'all checks passed'})")
    )
    if message_file is not None:
        message_file.parent.mkdir(parents=True, exist_ok=True)
        message_file.write_text(message + "\n")
    print(message)
    return {**result, "message": message}


def fetch_prefix(uri: str, dest: Path) -> Path:
    """Download the objects under an S3 prefix (a Model Monitor job mounts only its capture)."""
    import boto3

    from .s3uri import split_s3

    bucket, prefix = split_s3(uri)
    s3 = boto3.client("s3")
    found = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            target = dest / obj["Key"][len(prefix) :].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, obj["Key"], str(target))
            found += 1
    if not found:
        raise SluiceError(
            f"no tokenizer under {uri}: rebuild the baseline (sluice monitor baseline)"
        )
    return dest


def run_from_env(env: dict[str, str] | None = None) -> dict:
    """`sluice monitor` with no arguments: a Model Monitor or Processing job's entrypoint."""
    env = dict(os.environ if env is None else env)
    m = MonitorEnv.from_env(env)
    model = Path(env.get("SLUICE_MODEL_DIR", "/opt/ml/processing/baseline/tokenizer"))
    if not model.exists() and env.get("SLUICE_TOKENIZER_S3_URI"):
        model = fetch_prefix(env["SLUICE_TOKENIZER_S3_URI"], m.output_path / ".tokenizer")
    return run_monitor(
        [m.dataset_source],
        m.baseline_statistics,
        m.baseline_constraints,
        model,
        m.output_path,
        metrics_dir=m.metrics_dir if m.publish_metrics else None,
        endpoint=m.endpoint,
        schedule=m.schedule,
        message_file=Path(env.get("SLUICE_MESSAGE_FILE", "/opt/ml/output/message")),
    )
