"""`python -m sluice_local.sagemaker.neo IN.tar.gz OUT.tar.gz ...`: Neo's checks, on this machine.

Neo itself (TVM) does not run here. What it checks before compiling does: the framework and
version it supports for the target, the archive holding one traced TorchScript model, and that
model running at the declared static input shapes and dtype. A model that passes is packed as
the compiled artifact (the same TorchScript, re-saved, with what it was checked at).
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path

# Neo's PyTorch versions for cloud (ml_*) targets, the newest being 2.0.
PYTORCH_VERSIONS = {"1.4", "1.5", "1.6", "1.7", "1.8", "1.12", "1.13", "2.0"}


class Refused(Exception):
    """What Neo answers with a ClientError."""


def check(args: argparse.Namespace) -> dict:
    if args.framework.upper() != "PYTORCH":
        raise Refused(
            f"Framework {args.framework} is not supported by the local compiler "
            "(Sluice exports PyTorch)"
        )
    if not args.target.startswith("ml_"):
        raise Refused(f"TargetDevice {args.target}: the local compiler checks ml_* cloud targets")
    if args.framework_version not in PYTORCH_VERSIONS:
        raise Refused(
            f"FrameworkVersion {args.framework_version} is not supported for PYTORCH "
            f"on {args.target} (supported: {sorted(PYTORCH_VERSIONS)})"
        )
    try:
        shapes = json.loads(args.data_input_config)
        options = json.loads(args.compiler_options or "{}")
    except ValueError as e:
        raise Refused(f"DataInputConfig/CompilerOptions is not JSON: {e}") from None
    if not isinstance(shapes, dict) or not shapes:
        raise Refused(
            'DataInputConfig must name each input with its shape, e.g. {"input_ids": [1, 128]}'
        )

    import torch

    dtype = {
        "int64": torch.int64,
        "int32": torch.int32,
        "float32": torch.float32,
        "float16": torch.float16,
    }.get(options.get("dtype", "float32"))
    if dtype is None:
        raise Refused(f"CompilerOptions dtype {options.get('dtype')!r} is not supported")
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(args.input) as tar:
            tar.extractall(tmp, filter="data")
        found = sorted(Path(tmp).rglob("*.pth")) + sorted(Path(tmp).rglob("*.pt"))
        if len(found) != 1:
            raise Refused(f"the archive must hold one TorchScript model (.pth), found {len(found)}")
        try:
            module = torch.jit.load(str(found[0]), map_location="cpu")
        except Exception as e:
            raise Refused(f"{found[0].name} is not a TorchScript model: {e}") from None
        inputs = [torch.zeros(*shape, dtype=dtype) for shape in shapes.values()]
        try:
            with torch.inference_mode():
                result = module(*inputs)
        except Exception as e:
            raise Refused(
                f"the model does not run at {shapes} ({options.get('dtype', 'float32')})"
                f": {type(e).__name__}: {str(e).splitlines()[0][:300]}"
            ) from None
        first = result[0] if isinstance(result, tuple | list) else result
        info = {
            "target": args.target,
            "framework": f"PYTORCH {args.framework_version}",
            "inputs": shapes,
            "dtype": options.get("dtype", "float32"),
            "output_shape": list(first.shape),
        }
        out_dir = Path(tmp) / "compiled"
        out_dir.mkdir()
        torch.jit.save(module, str(out_dir / "model.pth"))
        (out_dir / "compiled.json").write_text(json.dumps(info, indent=2))
        with tarfile.open(args.output, "w:gz") as tar:
            for p in sorted(out_dir.iterdir()):
                tar.add(p, arcname=p.name)
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--framework", required=True)
    p.add_argument("--framework-version", default="")
    p.add_argument("--data-input-config", required=True)
    p.add_argument("--compiler-options", default="{}")
    p.add_argument("--target", required=True)
    args = p.parse_args(argv)
    try:
        info = check(args)
    except Refused as e:
        print(f"ClientError: {e}", flush=True)
        return 1
    print(
        f"compiled for {info['target']}: inputs {info['inputs']} ({info['dtype']}) -> "
        f"output {info['output_shape']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
