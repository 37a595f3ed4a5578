import itertools
import math
import re

import pytest

from sluice.hyperparameters import TrainConfig
from sluice.metrics import METRIC_DEFINITIONS, metric_line
from sluice.train import lr_factor


def test_warmup_then_cosine_to_the_floor():
    cfg = TrainConfig(warmup_steps=10, min_lr_ratio=0.1, lr_schedule="cosine")
    f = [lr_factor(s, cfg, 110) for s in range(111)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in itertools.pairwise(f[:10]))
    assert all(a >= b for a, b in itertools.pairwise(f[10:]))
    assert f[60] == pytest.approx(0.1 + 0.9 * 0.5)
    assert f[110] == pytest.approx(0.1)


def test_linear_decay():
    cfg = TrainConfig(warmup_steps=0, min_lr_ratio=0.0, lr_schedule="linear")
    assert [lr_factor(s, cfg, 4) for s in range(5)] == pytest.approx([1, 0.75, 0.5, 0.25, 0])


def test_every_metric_definition_reads_the_printed_line():
    values = {d["Name"]: 10 ** -(i + 1) * 3.25 for i, d in enumerate(METRIC_DEFINITIONS)}
    line = metric_line(step=7, **values)
    for d in METRIC_DEFINITIONS:
        m = re.search(d["Regex"], line)
        assert m, d
        assert float(m.group(1)) == pytest.approx(values[d["Name"]], rel=1e-5)
    # names that are prefixes of others must not match the longer one
    assert (
        re.search(
            next(d["Regex"] for d in METRIC_DEFINITIONS if d["Name"] == "validation_loss"),
            metric_line(validation_perplexity=2.0),
        )
        is None
    )
    assert "nan" in metric_line(train_loss=math.nan)


def test_evaluation_json_is_strict_json_whatever_the_figures():
    """JSON has no NaN or Infinity: they are written as null, never as bare tokens."""
    import json
    import math

    from sluice.metrics import strict_json

    text = strict_json({"loss": math.nan, "ppl": [1.5, math.inf], "n": 3, "ok": True})
    assert text == '{"loss": null, "ppl": [1.5, null], "n": 3, "ok": true}'
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard token {c}"))
