"""The image's GPU dependency set, resolved from the package registry, against SageMaker's drivers.

    python scripts/gpu_deps_check.py [--report FILE] [--from-report FILE]

1. Resolves what container/Dockerfile installs on the image's platform (Linux x86-64, the
   Dockerfile's Python): its torch line and the container package's dependencies with the `gpu`
   extra, under requirements/main.lock, as a `pip install --dry-run --report` for that platform
   against the registry alone (no local wheels, no constraints of this machine).
2. Reads the CUDA runtime the resolved wheels need (nvidia-cuda-runtime, the `-cuNN` packages).
3. Reads SageMaker's host images and their NVIDIA drivers from botocore's own model
   documentation (TransformAmiVersion, InferenceAmiVersion) and checks each GPU host the template
   uses by default: the driver runs the CUDA natively (NVIDIA's minimum driver per CUDA release),
   or through the forward-compatibility package the Dockerfile installs (on the driver branches
   NVIDIA supports it on), or the check fails.

Exits 1 when the resolution fails, when the set mixes CUDA majors, or when a default GPU host
cannot run the image's CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# NVIDIA CUDA Toolkit release notes, "CUDA Toolkit and Minimum Required Driver Version for CUDA
# Minor Version Compatibility": any driver of at least this version runs every release of the
# major (13.x needs the 580 branch).
MIN_DRIVER = {13: (580, 65, 6), 12: (525, 60, 13), 11: (450, 80, 2)}
# NVIDIA CUDA Compatibility guide, "Forward Compatibility": the cuda-compat-<major>-<minor>
# package runs that CUDA on older data-center drivers of these branches (checked on a host of that
# driver before relying on it: docs/container.md).
FORWARD_COMPAT_BRANCHES = {13: (535, 550, 570, 575)}


@dataclass(frozen=True)
class Host:
    path: str  # "transform", "endpoint"
    ami: str
    driver: int  # the branch, e.g. 535


def host_images() -> dict[str, dict[str, int]]:
    """{"TransformAmiVersion": {ami: driver branch}, "InferenceAmiVersion": {...}}, as botocore's
    SageMaker model documents them."""
    from botocore.session import get_session

    model = get_session().get_service_model("sagemaker")
    docs = {
        "TransformAmiVersion": model.shape_for("TransformResources")
        .members["TransformAmiVersion"]
        .documentation,
        "InferenceAmiVersion": model.shape_for("ProductionVariant")
        .members["InferenceAmiVersion"]
        .documentation,
    }
    out = {}
    for field, html in docs.items():
        text = re.sub(r"<[^>]+>", " ", html)
        found = re.findall(
            r"(al2\S*-gpu-[\w-]+)\s+Accelerator: GPU\s+NVIDIA driver version: (\d+)", text
        )
        out[field] = {ami: int(driver) for ami, driver in found}
    return out


def template_defaults() -> dict[str, str]:
    from sluice_local.template import load_template

    params = load_template(REPO / "template.yaml")["Parameters"]
    return {k: str(v.get("Default", "")) for k, v in params.items()}


def default_hosts() -> list[Host]:
    """The GPU hosts a deployment on the template's defaults runs the image on."""
    from sluice_functions.instances import is_gpu

    d, images = template_defaults(), host_images()
    hosts = []
    if is_gpu(d["TransformInstanceType"]):
        ami = d["TransformAmiVersion"]
        hosts.append(Host("transform", ami, images["TransformAmiVersion"][ami]))
    if is_gpu(d["EndpointInstanceType"]):
        ami = d["EndpointAmiVersion"]
        hosts.append(Host("endpoint", ami, images["InferenceAmiVersion"][ami]))
    return hosts


def dockerfile_facts(text: str) -> dict:
    torch = re.search(r"pip install [^\n]*?(torch==\S+)", text)
    compat = re.search(r"cuda-compat-(\d+)-(\d+)", text)
    py = re.search(r"FROM python:(\d+\.\d+)", text)
    lock = re.search(r"pip install -c (\S+) torch==", text)
    return {
        "lock": lock.group(1) if lock else None,
        "torch": torch.group(1) if torch else None,
        "compat": (int(compat.group(1)), int(compat.group(2))) if compat else None,
        "python": py.group(1) if py else None,
    }


def requirements() -> list[str]:
    """What the Dockerfile installs: its torch line, the container package's dependencies and
    its `gpu` extra."""
    facts = dockerfile_facts((REPO / "container/Dockerfile").read_text())
    project = tomllib.loads((REPO / "container/pyproject.toml").read_text())["project"]
    wanted = [facts["torch"], *project["optional-dependencies"]["gpu"]]
    return wanted + [d for d in project["dependencies"] if not d.startswith("torch")]


def lock_pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if m:
            pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return pins


def resolve(python: str, lock: Path | None) -> dict:
    """pip's install report for the image's platform, from the registry alone (under `lock`)."""
    wanted = requirements()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        platforms = [f"manylinux_2_{n}_x86_64" for n in range(5, 40)]
        platforms += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--isolated",
            "--quiet",
            "--dry-run",
            "--ignore-installed",
            "--target",
            str(Path(tmp) / "target"),
            "--report",
            str(report),
            "--only-binary=:all:",
            "--python-version",
            python,
            "--implementation",
            "cp",
            *[a for p in platforms for a in ("--platform", p)],
            *(["-c", str(lock)] if lock else []),
            *wanted,
        ]
        # the registry alone: not this machine's wheel folders, indexes or constraint files
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("PIP_") or k in ("PIP_CERT", "PIP_DEFAULT_TIMEOUT")
        }
        env["PIP_CONFIG_FILE"] = os.devnull
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"resolution failed:\n{proc.stderr[-3000:]}")
        return json.loads(report.read_text())


def cuda_of(report: dict) -> dict:
    """The CUDA runtime the resolved set needs: {"runtime": (13, 0), "majors": {...}, ...}."""
    installed = {
        re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower(): i["metadata"]["version"]
        for i in report["install"]
    }
    runtime = installed.get("nvidia-cuda-runtime") or installed.get("nvidia-cuda-runtime-cu12")
    majors = {}
    for name in installed:
        m = re.search(r"-cu(\d+)$", name)
        if m and not name.startswith("nvidia-cutlass-dsl-libs"):  # ships one per CUDA major
            majors[name] = int(m.group(1))
    version = tuple(int(x) for x in runtime.split(".")[:2]) if runtime else None
    return {"runtime": version, "majors": majors, "torch": installed.get("torch"), "all": installed}


def verdicts(
    cuda: tuple[int, int], compat: tuple[int, int] | None, hosts: list[Host]
) -> list[dict]:
    out = []
    need = MIN_DRIVER[cuda[0]]
    for h in hosts:
        if h.driver >= need[0]:
            how, ok = f"native (driver {h.driver} >= {need[0]})", True
        elif (
            compat and compat[0] == cuda[0] and h.driver in FORWARD_COMPAT_BRANCHES.get(cuda[0], ())
        ):
            how, ok = (
                f"forward compatibility (cuda-compat-{compat[0]}-{compat[1]} on branch {h.driver})",
                True,
            )
        else:
            how, ok = f"cannot run CUDA {cuda[0]}.{cuda[1]} (needs driver {need[0]}+)", False
        out.append({"path": h.path, "ami": h.ami, "driver": h.driver, "how": how, "ok": ok})
    return out


LOCK_HEADER = """\
# The image's Python environment (container/Dockerfile: CUDA torch and vLLM), every version pinned:
# resolved for Linux x86-64 and the Dockerfile's Python from the package registry by
#   python scripts/gpu_deps_check.py --write-lock
# CI resolves the image again under it, checks it is complete and checks its CUDA against
# SageMaker's GPU drivers. (requirements/main.lock is the CPU environment of developers and CI.)
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--report", type=Path, help="write pip's resolution report here")
    p.add_argument("--from-report", type=Path, help="analyse this report instead of resolving")
    p.add_argument(
        "--write-lock", action="store_true", help="resolve afresh and write the image's lock"
    )
    args = p.parse_args(argv)
    facts = dockerfile_facts((REPO / "container/Dockerfile").read_text())
    lock = REPO / facts["lock"] if facts["lock"] else None
    if args.from_report:
        report = json.loads(args.from_report.read_text())
    else:
        report = resolve(facts["python"], None if args.write_lock else lock)
        if args.report:
            args.report.parent.mkdir(parents=True, exist_ok=True)
            args.report.write_text(json.dumps(report))
    cuda = cuda_of(report)
    failed = []
    if args.write_lock:
        if lock is None:
            raise SystemExit("the Dockerfile names no lock (pip install -c LOCK torch==...)")
        lines = sorted(
            f"{i['metadata']['name']}=={i['metadata']['version']}" for i in report["install"]
        )
        lock.write_text(LOCK_HEADER + "\n".join(lines) + "\n")
        print(f"wrote {lock.relative_to(REPO)}: {len(lines)} pins")
    elif lock is not None:
        pins = lock_pins(lock.read_text())
        unpinned = sorted(set(cuda["all"]) - set(pins))
        if unpinned:
            failed.append(f"{facts['lock']} does not pin {unpinned} (run --write-lock)")
    print(f"resolved {len(cuda['all'])} packages for Linux x86-64, Python {facts['python']}")
    for name in sorted(cuda["all"]):
        if name.startswith(("torch", "vllm", "triton", "nvidia-", "cuda-", "flashinfer")):
            print(f"  {name}=={cuda['all'][name]}")
    if cuda["runtime"] is None:
        failed.append("no CUDA runtime in the resolved set (a CPU torch?)")
    mixed = {n: m for n, m in cuda["majors"].items() if cuda["runtime"] and m != cuda["runtime"][0]}
    if mixed:
        failed.append(f"packages of another CUDA major than the runtime's: {mixed}")
    if cuda["runtime"]:
        major, minor = cuda["runtime"]
        print(f"CUDA runtime {major}.{minor}; forward-compatibility package {facts['compat']}")
        for v in verdicts(cuda["runtime"], facts["compat"], default_hosts()):
            print(f"  {v['path']:<10} {v['ami']:<42} {'ok' if v['ok'] else 'FAILS'}: {v['how']}")
            if not v["ok"]:
                failed.append(f"{v['path']} on {v['ami']}: {v['how']}")
    for f in failed:
        print(f"FAILED: {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
