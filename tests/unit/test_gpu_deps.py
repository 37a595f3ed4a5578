"""The image's CUDA against SageMaker's GPU drivers (scripts/gpu_deps_check.py; CI runs it on the
registry's resolution, these tests its reading of the facts)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("gpu_deps_check", REPO / "scripts/gpu_deps_check.py")
g = importlib.util.module_from_spec(spec)
sys.modules["gpu_deps_check"] = g  # its dataclasses look their module up
spec.loader.exec_module(g)


def report(**packages: str) -> dict:
    return {"install": [{"metadata": {"name": n, "version": v}} for n, v in packages.items()]}


def test_sagemakers_host_images_and_drivers_come_from_botocores_model():
    images = g.host_images()
    assert images["TransformAmiVersion"] == {
        "al2-ami-sagemaker-batch-gpu-470": 470,
        "al2-ami-sagemaker-batch-gpu-535": 535,
    }
    assert images["InferenceAmiVersion"]["al2023-ami-sagemaker-inference-gpu-4-1"] == 580
    assert images["InferenceAmiVersion"]["al2-ami-sagemaker-inference-gpu-2"] == 535


def test_the_template_default_hosts_are_the_ones_checked():
    hosts = {h.path: h for h in g.default_hosts()}
    assert hosts["transform"].driver == 535
    assert hosts["endpoint"].ami == "al2023-ami-sagemaker-inference-gpu-4-1"


def test_the_dockerfile_installs_a_pinned_torch_under_its_lock_with_the_compat_package():
    facts = g.dockerfile_facts((REPO / "container/Dockerfile").read_text())
    assert facts["torch"] == "torch==2.13.0"
    assert facts["lock"] == "requirements/gpu.lock"
    assert facts["compat"] == (13, 0)
    assert facts["python"] == "3.11"
    pins = g.lock_pins((REPO / facts["lock"]).read_text())
    assert pins["torch"] == "2.13.0" and pins["vllm"] == "0.32.0"
    assert pins["nvidia-cuda-runtime"].startswith("13.0.")


def test_cuda_is_read_from_the_runtime_wheel_and_the_cu_packages():
    cuda = g.cuda_of(
        report(
            torch="2.13.0",
            **{
                "nvidia-cuda-runtime": "13.0.96",
                "nvidia-nccl-cu13": "2.29.7",
                "nvidia-cutlass-dsl-libs-cu12": "4.8.0",  # one per major, by design
            },
        )
    )
    assert cuda["runtime"] == (13, 0)
    assert cuda["majors"] == {"nvidia-nccl-cu13": 13}
    assert g.cuda_of(report(torch="2.13.0+cpu"))["runtime"] is None


def test_a_host_runs_the_cuda_natively_through_compat_or_not_at_all():
    hosts = [
        g.Host("endpoint", "al2023-ami-sagemaker-inference-gpu-4-1", 580),
        g.Host("transform", "al2-ami-sagemaker-batch-gpu-535", 535),
        g.Host("transform", "al2-ami-sagemaker-batch-gpu-470", 470),
    ]
    native, compat, old = g.verdicts((13, 0), (13, 0), hosts)
    assert native["ok"] and native["how"].startswith("native")
    assert compat["ok"] and compat["how"].startswith("forward compatibility")
    assert not old["ok"]  # no forward compatibility for CUDA 13 on R470
    # without the compat package in the image, driver 535 cannot run CUDA 13
    assert not g.verdicts((13, 0), None, hosts[1:2])[0]["ok"]
    # a CUDA 12 image runs natively on 535 (minor version compatibility from 525.60.13)
    assert g.verdicts((12, 8), None, hosts[1:2])[0]["ok"]


def test_the_check_fails_on_an_incomplete_lock_or_mixed_majors(tmp_path, capsys, monkeypatch):
    bad = report(
        torch="2.13.0",
        **{"nvidia-cuda-runtime": "13.0.96", "nvidia-nccl-cu12": "2.27.3", "unpinned-pkg": "1"},
    )
    path = tmp_path / "report.json"
    path.write_text(json.dumps(bad))
    assert g.main(["--from-report", str(path)]) == 1
    out = capsys.readouterr().out
    assert "does not pin ['nvidia-nccl-cu12', 'unpinned-pkg']" in out
    assert "another CUDA major" in out
