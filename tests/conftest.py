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


@pytest.fixture(scope="session")
def plain_server(trained, tmp_path_factory):
    """`sluice serve` on the shared model with its defaults (an endpoint, not a batch job), for
    tests that only send it requests; tests that stop or misconfigure a server start their own.
    Its users name the xdist_group "plain-server" so that one worker starts it once. Its
    torch.compile (inductor) cache is its own, so that tests can see what it built."""
    from tests.helpers import Server

    s = Server(trained["model"], TORCHINDUCTOR_CACHE_DIR=str(tmp_path_factory.mktemp("inductor")))
    yield s
    s.stop()


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


# Figures tests measured (tests.helpers.FIGURES), carried in their reports' user_properties so
# that they reach the terminal summary from pytest-xdist's workers too.
_REPORTED: list[str] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    from tests.helpers import FIGURES

    # a module fixture's teardown adds its figure during the last test's teardown phase
    item.user_properties += [("figure", f) for f in FIGURES]
    FIGURES.clear()
    return (yield)


def pytest_runtest_logreport(report):
    for name, value in report.user_properties:
        if name == "figure" and value not in _REPORTED:
            _REPORTED.append(value)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (make test: --dist loadgroup) a module's tests run on one worker, so a
    module fixture (a server, a stack) starts once; modules that share a session fixture name
    the same `xdist_group` to share one worker and that fixture."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def pytest_terminal_summary(terminalreporter):
    """The figures tests measured (e.g. the retraining fault-injection count), after the results."""
    for figure in _REPORTED:
        terminalreporter.write_line(figure)
