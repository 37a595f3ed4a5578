"""Every value a parameter allows leads to a deployment AWS accepts.

CloudFormation checks a parameter against its own constraints (MinValue, MaxValue,
AllowedValues, AllowedPattern, MaxLength) and nothing else: a value inside them can still make a
resource AWS refuses (a Stage ending in "-" names an endpoint and a model package group that
SageMaker's name pattern refuses; a batching window of 0 with batches of 1000 is an event source
mapping Lambda refuses). Each extreme goes through the local deployer with every request checked
as AWS checks it (service models and sluice_local.aws_rules): the minima together, the maxima
together, each allowed value, and each adversarial string a pattern lets through.
"""

from __future__ import annotations

import re
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from sluice_local.deploy import Deployer
from sluice_local.template import load_template, samconfig_overrides, transform
from sluice_local.validation import strict_clients

REPO = Path(__file__).resolve().parents[2]
PARAMETERS = load_template(REPO / "template.yaml")["Parameters"]
# strings a pattern might let through that derived names would not survive
ADVERSARIAL = ["a", "0", "-", "a-", "-a", "a--b", "a_b", "A", "a.b", "a/b:c@d"]


def _extreme_sets() -> list[tuple[str, dict[str, str]]]:
    low, high = {}, {}
    by_index: dict[int, dict[str, str]] = {}
    for name, spec in PARAMETERS.items():
        if "MinValue" in spec:
            low[name] = str(spec["MinValue"])
        if "MaxValue" in spec:
            high[name] = str(spec["MaxValue"])
        for i, value in enumerate(spec.get("AllowedValues") or []):
            by_index.setdefault(i, {})[name] = str(value)
    sets = [("minima", low), ("maxima", high)]
    sets += [(f"allowed value #{i}", values) for i, values in sorted(by_index.items())]
    for name, spec in PARAMETERS.items():
        pattern = spec.get("AllowedPattern")
        if not pattern:
            continue
        longest = spec.get("MaxLength")
        candidates = ADVERSARIAL + ([("ab-" * 100)[: int(longest)]] if longest else [])
        for value in candidates:
            if re.fullmatch(pattern, value) and len(value) <= int(longest or 4096):
                sets.append((f"{name}={value!r}", {name: value}))
    return sets


SETS = _extreme_sets()


def test_the_sets_cover_every_constrained_parameter():
    constrained = {
        n
        for n, s in PARAMETERS.items()
        if {"MinValue", "MaxValue", "AllowedValues", "AllowedPattern"} & set(s)
    }
    covered = set().union(*(set(values) for _, values in SETS))
    assert constrained <= covered, constrained - covered


@pytest.fixture(scope="module")
def aws():
    with mock_aws():
        yield


@pytest.mark.parametrize(("label", "values"), SETS, ids=[label for label, _ in SETS])
def test_each_extreme_deploys_as_aws_would_accept_it(aws, monkeypatch, label, values):
    for k, v in {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "t"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "t")
    overrides = {**samconfig_overrides(REPO / "samconfig.toml"), **values}
    # one stage per set: every deployment creates its own names
    overrides.setdefault("Stage", f"x{abs(hash(label)) % 10**8}")
    t = transform(REPO / "template.yaml", overrides)
    with strict_clients() as refused:
        Deployer(
            t, lambda s: boto3.client(s, region_name="us-east-1"), f"x-{overrides['Stage']}"
        ).deploy()
    assert not refused, refused
