"""Shared fixtures: a generated corpus and a tiny model trained once through the real CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import hp, run_sluice, sets

# What template.yaml's Globals give every function, before any handler module is imported (the
# Powertools Logger and Metrics read them once, at import).
os.environ.setdefault("POWERTOOLS_METRICS_NAMESPACE", "Sluice")
os.environ.setdefault("POWERTOOLS_SERVICE_NAME", "sluice-tests")


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory) -> Path:
    from sluice_local.corpus import write_corpus

    d = tmp_path_factory.mktemp("corpus")
    write_corpus(d / "train" / "part-1.txt", 1500, seed=1)
    write_corpus(d / "train" / "nested" / "part-2.txt", 1500, seed=2)
    write_corpus(d / "heldout" / "eval.txt", 300, seed=99)
    return d


@pytest.fixture(scope="session")
def trained(tmp_path_factory, corpus_dir) -> dict:
    """One tiny model trained from scratch through the CLI, shared by tests that need a model."""
    out = tmp_path_factory.mktemp("trained")
    proc = run_sluice(
        "train",
        "--train",
        str(corpus_dir / "train"),
        "--output",
        str(out),
        *sets(hp(max_steps=40, export_edge="true", loss_curve="true")),
    )
    return {"out": out, "model": out / "model", "stdout": proc.stdout}


@pytest.fixture
def strict_aws():
    """Every AWS request sent in the test (by the code under test or the test itself) is checked
    against the service's own rules first (sluice_local.validation), refused as AWS would refuse
    it, and the test fails if any was, even when the code swallowed the error."""
    from sluice_local.validation import strict_clients

    with strict_clients() as seen:
        yield seen
    assert not seen, "requests AWS would refuse:\n" + "\n".join(
        f"{service} {op}: {'; '.join(found)}" for service, op, found in seen
    )


def pytest_terminal_summary(terminalreporter):
    """The figures tests measured (e.g. the retraining fault-injection count), after the results."""
    from tests.helpers import FIGURES

    for figure in FIGURES:
        terminalreporter.write_line(figure)
