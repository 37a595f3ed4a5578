"""scripts/image_check.py reads the Dockerfile itself: its parsing, the one allowed difference."""

import importlib.util
import sys

from tests.helpers import REPO

spec = importlib.util.spec_from_file_location("image_check", REPO / "scripts" / "image_check.py")
image_check = importlib.util.module_from_spec(spec)
sys.modules["image_check"] = image_check
spec.loader.exec_module(image_check)


def test_the_dockerfile_copies_only_the_container_package():
    steps = image_check.parse_dockerfile((REPO / "container" / "Dockerfile").read_text())
    copied = [w for s in steps if s.op == "COPY" for w in s.args.split()[:-1]]
    assert copied and all(c.startswith(("container/", "requirements/")) for c in copied), copied
    assert not any("functions" in c or "local" in c for c in copied)
    assert next(s for s in steps if s.op == "ENTRYPOINT").args == '["sluice"]'


def test_continuations_and_comments():
    steps = image_check.parse_dockerfile(
        "# c\nFROM python:3.11-slim\nRUN a \\\n    # inside\n    && b\nENV A=1 B=two\n"
    )
    assert [(s.op, s.args) for s in steps] == [
        ("FROM", "python:3.11-slim"),
        ("RUN", "a && b"),
        ("ENV", "A=1 B=two"),
    ]
    assert image_check.parse_env("A=1 B=two") == {"A": "1", "B": "two"}


def test_only_the_cuda_index_is_replaced():
    cuda = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
    assert image_check.cpu_variant(cuda) == "pip install torch==2.13.0"
    other = "pip install -c constraints.txt --index-url https://example.org/simple ./container"
    assert image_check.cpu_variant(other) == other
    gpu = "pip install -c constraints.txt './container[gpu]'"
    assert image_check.cpu_variant(gpu) == "pip install -c constraints.txt './container[cpu]'"


def test_dockerignore_patterns(tmp_path):
    src = tmp_path / "container" / "sluice"
    (src / "__pycache__").mkdir(parents=True)
    (src / "cli.py").write_text("x")
    (src / "__pycache__" / "cli.cpython-311.pyc").write_text("x")
    (tmp_path / ".dockerignore").write_text("**/__pycache__\n**/*.egg-info\n")
    n = image_check.copy_into(
        tmp_path, "container/sluice", tmp_path / "out", image_check.dockerignore(tmp_path)
    )
    assert n == 1 and (tmp_path / "out" / "cli.py").exists()
