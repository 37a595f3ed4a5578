"""`sluice`: the image's entrypoints (SageMaker runs `IMAGE train`, `IMAGE serve`, ...) and the
same commands on local folders. Heavy imports happen inside each command so `--help` stays fast.
The image holds only what SageMaker runs: the local emulator (`sluice-local`) is another package.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from pathlib import Path

from .errors import ExitCode, SluiceError, write_failure

log = logging.getLogger("sluice")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class HelpFormatter(argparse.HelpFormatter):
    """Wraps one-paragraph texts; keeps multi-line ones (exit codes, hyperparameters) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def setup_logging(level: str = "INFO") -> None:
    """One log format on stdout (SageMaker sends it to CloudWatch, where metric regexes read it)."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
        force=True,
    )
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def parse_sets(items: list[str]) -> dict[str, str]:
    """`NAME=VALUE` flags as a dict (the value may itself hold `=`)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SluiceError(f"--set expects NAME=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


# --- train ----------------------------------------------------------------------


def hyperparameter_help() -> str:
    from .hyperparameters import TrainConfig

    lines = ["hyperparameters (hyperparameters.json on SageMaker, --set NAME=VALUE here):"]
    for name, (doc, default) in TrainConfig.field_docs().items():
        lines.append(f"  {name:22} {doc} [default: {default}]")
    return "\n".join(lines)


def cmd_train(args: argparse.Namespace, argv: list[str]) -> int:
    from .paths import OptML

    # local flags become the SageMaker environment, so torchrun workers see the same job
    if args.output:
        os.environ["SLUICE_OPT_ML"] = str(Path(args.output).resolve())
    for channel in ("train", "validation", "baseline", "pretrained"):
        value = getattr(args, channel)
        if value:
            os.environ[f"SM_CHANNEL_{channel.upper()}"] = str(Path(value).resolve())
    opt = OptML.from_env()
    rank = int(os.environ.get("RANK", 0))
    try:
        from .distributed import run_torchrun, torchrun_args
        from .hyperparameters import for_trial, parse_hyperparameters

        raw = {**opt.hyperparameters(), **parse_sets(args.set)}
        cfg = parse_hyperparameters(for_trial(raw, opt.checkpoint_dir, os.environ))
        launch = torchrun_args(opt, args.nproc)
        if launch is not None:
            return run_torchrun(launch, argv)
        from .train import Interrupted, StopFlag, run_training

        stop = StopFlag(stop_after_step=int(os.environ.get("SLUICE_STOP_AFTER_STEP", 0)))
        try:
            report = run_training(opt, cfg, progress=show_progress(args), stop=stop)
        except Interrupted as e:
            log.warning("%s", e)
            return ExitCode.INTERRUPTED
        if report:
            print(json.dumps(report["comparison"]))
        return ExitCode.OK
    except SluiceError as e:
        log.error("training failed: %s", e)
        if rank == 0 or not opt.failure_file.exists():
            write_failure(opt.failure_file, str(e))
        return ExitCode.FAILED
    except Exception as e:
        traceback.print_exc()
        if rank == 0 or not opt.failure_file.exists():
            write_failure(opt.failure_file, f"internal error: {type(e).__name__}: {e}")
        return ExitCode.INTERNAL


# --- evaluate / export ----------------------------------------------------------------------


def cmd_evaluate(args: argparse.Namespace, argv: list[str]) -> int:
    from types import SimpleNamespace

    from .data import Cleaner, iter_channel
    from .evaluate import evaluate_dirs

    cfg = SimpleNamespace(text_field=args.text_field, text_column=args.text_column, txt_mode="line")
    records = [t for t, _ in iter_channel(Path(args.data), cfg, Cleaner())]
    if args.max_records:
        records = records[: args.max_records]
    if not records:
        raise SluiceError(f"{args.data} has no records to evaluate on")
    result = evaluate_dirs(
        [Path(m) for m in args.models], records, args.device, progress=show_progress(args)
    )
    print(json.dumps(result, indent=2))
    return ExitCode.OK


def cmd_export(args: argparse.Namespace, argv: list[str]) -> int:
    from .export import export_edge

    info = export_edge(Path(args.model), Path(args.output), args.seq_len, onnx=not args.no_onnx)
    print(json.dumps(info, indent=2))
    return ExitCode.OK


def cmd_serve(args: argparse.Namespace, argv: list[str]) -> int:
    from .serve import serve

    model_dir = args.model_dir or os.environ.get("SM_MODEL_DIR", "/opt/ml/model")
    return serve(Path(model_dir), args.port, args.host)


def cmd_monitor(args: argparse.Namespace, argv: list[str]) -> int:
    from . import monitor

    if args.mode is None:  # a Model Monitor / Processing job: everything comes from the env
        message = Path(os.environ.get("SLUICE_MESSAGE_FILE", "/opt/ml/output/message"))
        try:
            monitor.run_from_env()
        except SluiceError as e:
            write_failure(message, str(e))
            raise
        return ExitCode.OK
    if not args.data or not args.model or not args.output:
        raise SluiceError("sluice monitor baseline|run needs --data, --model and --output")
    data, out = [Path(d) for d in args.data], Path(args.output)
    if args.mode == "baseline":
        stats = monitor.run_baseline(data, Path(args.model), out, outputs=args.reference_outputs)
        print(f"baseline of {stats['dataset']['item_count']} records written to {out}")
        return ExitCode.OK
    if not args.baseline:
        raise SluiceError(
            "sluice monitor run needs --baseline DIR (statistics.json, constraints.json)"
        )
    base = Path(args.baseline)
    result = monitor.run_monitor(
        data,
        base / "statistics.json",
        base / "constraints.json",
        Path(args.model),
        out,
        metrics_dir=Path(args.metrics_dir) if args.metrics_dir else None,
    )
    if result["violations"] and args.fail_on_violations:
        return ExitCode.DRIFT
    return ExitCode.OK


# --- parser ----------------------------------------------------------------------


def show_progress(args: argparse.Namespace) -> bool:
    """--progress / --no-progress, else a bar only when someone watches stderr."""
    return sys.stderr.isatty() if args.progress is None else args.progress


def top_parser(prog: str, version: str, description: str) -> argparse.ArgumentParser:
    """What every Sluice command line has: --version, --log-level and the exit codes."""
    p = argparse.ArgumentParser(
        prog=prog, description=description, epilog=ExitCode.help(), formatter_class=HelpFormatter
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version}")
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default=os.environ.get("SLUICE_LOG_LEVEL", "INFO").upper(),
        help="log verbosity (default: SLUICE_LOG_LEVEL or INFO)",
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    """The `sluice` command line: one subcommand per entrypoint of the image."""
    from . import __version__

    p = top_parser(
        "sluice",
        __version__,
        "Sluice's language-model container: the commands SageMaker runs in the image "
        "(train, serve, evaluate, export, monitor). With no flags each follows SageMaker's "
        "container contract; the flags run the same code on local folders.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser(
        "train",
        help="train or fine-tune a causal LM (SageMaker training entrypoint)",
        description="Train from scratch (BPE tokenizer + GPT-2 config) or fine-tune a pretrained "
        "causal LM. With no flags it follows SageMaker's /opt/ml contract; the flags run the same "
        "job on local folders.",
        epilog=hyperparameter_help(),
        formatter_class=HelpFormatter,
    )
    t.add_argument("--train", help="training data folder (channel `train`)")
    t.add_argument("--validation", help="validation data folder (optional)")
    t.add_argument("--baseline", help="champion model folder or model.tar.gz to compare against")
    t.add_argument("--pretrained", help="model folder or model.tar.gz to fine-tune")
    t.add_argument("--output", help="local stand-in for /opt/ml (model/, output/, checkpoints/)")
    t.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="hyperparameter"
    )
    t.add_argument("--nproc", type=int, help="processes per node (default: one per GPU)")
    t.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    t.set_defaults(func=cmd_train)

    e = sub.add_parser(
        "evaluate",
        help="score model folders on a dataset (loss, perplexity, byte perplexity)",
        description="Score one or more model folders on the same records and print JSON.",
    )
    e.add_argument("models", nargs="+", help="model folders (save_pretrained layout)")
    e.add_argument("--data", required=True, help="file or folder of .txt/.jsonl/.csv records")
    e.add_argument("--text-field", default="text", help="JSON Lines text field")
    e.add_argument("--text-column", default="text", help="CSV text column")
    e.add_argument("--max-records", type=int, default=0, help="score at most this many (0: all)")
    e.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    e.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    e.set_defaults(func=cmd_evaluate)

    x = sub.add_parser(
        "export",
        help="edge export: TorchScript for SageMaker Neo, and ONNX",
        description="Trace a fixed-shape TorchScript model (model.tar.gz with model.pth, Neo's "
        "input) and export ONNX, checking both against eager logits.",
    )
    x.add_argument("model", help="model folder (save_pretrained layout)")
    x.add_argument("--output", required=True, help="folder for model.tar.gz, model.onnx, neo.json")
    x.add_argument("--seq-len", type=int, default=128, help="fixed input length")
    x.add_argument("--no-onnx", action="store_true", help="skip the ONNX export")
    x.set_defaults(func=cmd_export)

    s = sub.add_parser(
        "serve",
        help="HTTP inference server for Batch Transform and endpoints (port 8080)",
        description="SageMaker's inference contract: GET /ping, GET /execution-parameters, POST "
        "/invocations (JSON Lines, JSON, text, CSV; tasks generate, score, next_token). "
        "Environment: SAGEMAKER_BIND_TO_PORT, SAGEMAKER_MAX_PAYLOAD_IN_MB, SAGEMAKER_BATCH, "
        "SLUICE_TASK, SLUICE_PARAMETERS, SLUICE_INVOCATION_TIMEOUT, SLUICE_TOKEN_BUDGET, "
        "SLUICE_DEVICE, SLUICE_DTYPE.",
    )
    s.add_argument("--model-dir", help="model folder (default: SM_MODEL_DIR or /opt/ml/model)")
    s.add_argument("--port", type=int, help="port (default: SAGEMAKER_BIND_TO_PORT or 8080)")
    s.add_argument("--host", default="0.0.0.0", help="address to bind")
    s.set_defaults(func=cmd_serve)

    m = sub.add_parser(
        "monitor",
        help="drift statistics for text (baseline, or a window against it)",
        description="baseline: statistics.json and constraints.json from training data. run: "
        "compare a window (data capture files, JSON Lines or text) with a baseline and write "
        "statistics.json, constraint_violations.json and report.md. With no mode, read Model "
        "Monitor's environment (dataset_source, output_path, baseline_statistics, ...).",
    )
    m.add_argument("mode", nargs="?", choices=("baseline", "run"))
    m.add_argument("--data", action="append", help="input folder or file (repeatable)")
    m.add_argument("--model", help="model folder or model.tar.gz whose tokenizer measures tokens")
    m.add_argument("--baseline", help="folder holding the baseline's statistics and constraints")
    m.add_argument("--output", help="where the results go")
    m.add_argument("--metrics-dir", help="also write CloudWatch metric lines here")
    m.add_argument(
        "--fail-on-violations",
        action="store_true",
        help=f"exit {ExitCode.DRIFT.value} on violations",
    )
    m.add_argument(
        "--reference-outputs",
        type=int,
        default=200,
        help="baseline: training prompts the model answers as the output reference",
    )
    m.set_defaults(func=cmd_monitor)

    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status is an ExitCode (see `sluice --help`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from .cuda_compat import DONE, reexec_if_needed
    from .malloc import DONE as PRELOADED
    from .malloc import reexec_serve

    reexec_if_needed(argv)  # returns unless the host's NVIDIA driver is older than the image's CUDA
    args = build_parser().parse_args(argv)
    # CPU hosts: serve re-executes itself with tcmalloc preloaded, where there is one (the parsed
    # command, not argv[0]: `sluice --log-level DEBUG serve` is serve too)
    if args.command == "serve":
        try:
            reexec_serve(argv)
        except SluiceError as e:
            print(f"sluice: {e}", file=sys.stderr)
            return ExitCode.FAILED
    setup_logging(args.log_level)
    if os.environ.get(DONE):
        log.info("CUDA forward compatibility libraries in use (%s)", os.environ[DONE])
    if os.environ.get(PRELOADED):
        log.info(
            "memory allocator: tcmalloc (%s; SLUICE_MALLOC=system for glibc's)",
            os.environ[PRELOADED],
        )
    try:
        return int(args.func(args, argv))
    except SluiceError as e:
        log.error("%s", e)
        return ExitCode.FAILED
    except KeyboardInterrupt:
        log.warning("interrupted")
        return ExitCode.CTRL_C
    except Exception:
        log.exception("internal error (a bug in Sluice)")
        return ExitCode.INTERNAL


if __name__ == "__main__":
    sys.exit(main())
