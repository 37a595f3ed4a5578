"""Metric log lines and the MetricDefinitions regexes that pick them up: defined once, here.

The training command prints e.g. `[metrics] step=120 train_loss=3.1416 tokens_per_second=5230.1`;
SageMaker applies each regex to the log stream. The retraining state machine's CreateTrainingJob
uses METRIC_DEFINITIONS verbatim (a test checks they agree).
"""

from __future__ import annotations

import json
import math

NUMBER = r"([-+]?(?:[0-9]*\.)?[0-9]+(?:[eE][-+]?[0-9]+)?)"
METRICS = (
    "train_loss",
    "learning_rate",
    "tokens_per_second",
    "validation_loss",
    "validation_perplexity",
    "baseline_perplexity",
    "validation_byte_perplexity",
    "baseline_byte_perplexity",
    # the two figures the promotion gate compares (evaluation.json's "comparison"), so the
    # state machine can gate on FinalMetricDataList without opening the model archive
    "gate_challenger",
    "gate_baseline",
    # 1 - challenger / baseline: ASL's intrinsics cannot multiply, so a Choice state compares
    # this with the promotion margin directly
    "gate_improvement",
)
METRIC_DEFINITIONS = [{"Name": name, "Regex": rf"\b{name}={NUMBER}"} for name in METRICS]


def finite_or_none(value):
    """`value` with every non-finite float (NaN, inf) replaced by None, recursively: JSON has no
    NaN, and a reader that meets a bare `NaN` token fails or guesses."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_none(v) for v in value]
    return value


def strict_json(value, **kwargs) -> str:
    """JSON that any parser reads: non-finite numbers become null."""
    return json.dumps(finite_or_none(value), allow_nan=False, **kwargs)


def metric_line(**values: float) -> str:
    """One log line carrying metrics in the documented `name=value` form."""
    parts = []
    for name, value in values.items():
        if isinstance(value, float):
            value = "nan" if math.isnan(value) else f"{value:.6g}"
        parts.append(f"{name}={value}")
    return "[metrics] " + " ".join(parts)
