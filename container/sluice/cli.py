"""`sluice`: the container's entrypoints (SageMaker runs `IMAGE train`, `IMAGE serve`, ...) and the
same commands for local use. Heavy imports happen inside each command so `--help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from pathlib import Path

from .errors import SluiceError, write_failure

log = logging.getLogger("sluice")


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stdout,
        force=True,
    )
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def parse_sets(items: list[str]) -> dict[str, str]:
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
        from .distributed import exec_torchrun, torchrun_args
        from .hyperparameters import parse_hyperparameters

        raw = {**opt.hyperparameters(), **parse_sets(args.set)}
        cfg = parse_hyperparameters(raw)
        launch = torchrun_args(opt, args.nproc)
        if launch is not None:
            exec_torchrun(launch, argv)
        from .train import Interrupted, StopFlag, run_training

        stop = StopFlag(stop_after_step=int(os.environ.get("SLUICE_STOP_AFTER_STEP", 0)))
        try:
            report = run_training(opt, cfg, progress=args.progress, stop=stop)
        except Interrupted as e:
            log.warning("%s", e)
            return 143
        if report:
            print(json.dumps(report["comparison"]))
        return 0
    except SluiceError as e:
        log.error("training failed: %s", e)
        if rank == 0 or not opt.failure_file.exists():
            write_failure(opt.failure_file, str(e))
        return 1
    except Exception as e:
        traceback.print_exc()
        if rank == 0 or not opt.failure_file.exists():
            write_failure(opt.failure_file, f"internal error: {type(e).__name__}: {e}")
        return 2


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
    result = evaluate_dirs([Path(m) for m in args.models], records, args.device)
    print(json.dumps(result, indent=2))
    return 0


def cmd_export(args: argparse.Namespace, argv: list[str]) -> int:
    from .export import export_edge

    info = export_edge(Path(args.model), Path(args.output), args.seq_len, onnx=not args.no_onnx)
    print(json.dumps(info, indent=2))
    return 0


def cmd_serve(args: argparse.Namespace, argv: list[str]) -> int:
    from .serve import serve

    model_dir = args.model_dir or os.environ.get("SM_MODEL_DIR", "/opt/ml/model")
    return serve(Path(model_dir), args.port, args.host)


def cmd_transform(args: argparse.Namespace, argv: list[str]) -> int:
    from .transform import TransformConfig, run_transform

    cfg = TransformConfig(
        content_type=args.content_type, accept=args.accept, split_type=args.split_type,
        strategy=args.strategy, max_payload_mb=args.max_payload_mb,
        concurrency=args.max_concurrent_transforms, assemble_with=args.assemble_with,
        join_source=args.join_source, env=parse_sets(args.env), compression=args.compression,
        capture_uri=args.capture_uri, timeout_s=args.invocation_timeout,
        max_retries=args.max_retries,
    )  # fmt: skip
    summary = run_transform(
        Path(args.model), args.input, args.output, cfg,
        manifest=args.manifest, endpoint_url=args.endpoint_url,
    )  # fmt: skip
    print(json.dumps(summary, indent=2))
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2))
    return 0 if summary["TransformJobStatus"] == "Completed" else 1


def cmd_monitor(args: argparse.Namespace, argv: list[str]) -> int:
    from . import monitor

    if args.mode is None:  # a Model Monitor / Processing job: everything comes from the env
        message = Path(os.environ.get("SLUICE_MESSAGE_FILE", "/opt/ml/output/message"))
        try:
            monitor.run_from_env()
        except SluiceError as e:
            write_failure(message, str(e))
            raise
        return 0
    if not args.data or not args.model or not args.output:
        raise SluiceError("sluice monitor baseline|run needs --data, --model and --output")
    data, out = [Path(d) for d in args.data], Path(args.output)
    if args.mode == "baseline":
        stats = monitor.run_baseline(data, Path(args.model), out,
                                     outputs=args.reference_outputs)  # fmt: skip
        print(f"baseline of {stats['dataset']['item_count']} records written to {out}")
        return 0
    if not args.baseline:
        raise SluiceError(
            "sluice monitor run needs --baseline DIR (statistics.json, constraints.json)"
        )
    base = Path(args.baseline)
    result = monitor.run_monitor(
        data, base / "statistics.json", base / "constraints.json", Path(args.model), out,
        metrics_dir=Path(args.metrics_dir) if args.metrics_dir else None,
    )  # fmt: skip
    return 2 if result["violations"] and args.fail_on_violations else 0


def cmd_local(args: argparse.Namespace, argv: list[str]) -> int:
    """`sluice local ...` is its own command line (sluice_local.cli), with its own --help."""
    try:
        from sluice_local.cli import main as local_main
    except ImportError as e:
        raise SluiceError(
            f"`sluice local` needs the local extra ({e.name} is missing): "
            "pip install -e '.[container,local]' (make setup does)"
        ) from None
    return local_main(argv[argv.index("local") + 1 :])


def cmd_demo(args: argparse.Namespace, argv: list[str]) -> int:
    from .demo import run_demo

    return run_demo(Path(args.workdir), steps=args.steps)


# --- parser ----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sluice",
        description="Sluice: batch inference and retraining of Transformer LMs on AWS.",
    )
    p.add_argument("--log-level", default=os.environ.get("SLUICE_LOG_LEVEL", "INFO"))
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser(
        "train",
        help="train or fine-tune a causal LM (SageMaker training entrypoint)",
        description="Train from scratch (BPE tokenizer + GPT-2 config) or fine-tune a pretrained "
        "causal LM. With no flags it follows SageMaker's /opt/ml contract; the flags run the same "
        "job on local folders.",
        epilog=hyperparameter_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    t.add_argument("--progress", action="store_true", help="show a progress bar")
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

    tr = sub.add_parser(
        "transform",
        help="run a Batch Transform locally against the real serve process",
        description="SageMaker Batch Transform semantics on this machine: inputs from a folder, "
        "an s3:// prefix (AWS_ENDPOINT_URL or --endpoint-url for moto/LocalStack) or a manifest; "
        "outputs <key>.out under --output.",
    )
    tr.add_argument("--model", required=True, help="model folder (save_pretrained layout)")
    tr.add_argument("--input", required=True, help="folder, file, s3://bucket/prefix or manifest")
    tr.add_argument("--output", required=True, help="folder or s3://bucket/prefix for .out files")
    tr.add_argument("--manifest", action="store_true", help="--input is a manifest file")
    tr.add_argument("--content-type", default="application/jsonlines")
    tr.add_argument("--accept", default="application/jsonlines")
    tr.add_argument("--split-type", choices=["Line", "None"], default="Line")
    tr.add_argument("--strategy", choices=["MultiRecord", "SingleRecord"], help="BatchStrategy")
    tr.add_argument("--max-payload-mb", type=int, help="MaxPayloadInMB (default: the container's)")
    tr.add_argument("--max-concurrent-transforms", type=int, help="requests in flight")
    tr.add_argument("--assemble-with", choices=["Line", "None"], default="Line")
    tr.add_argument("--join-source", choices=["Input", "None"], default="None")
    tr.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment for the serve process (e.g. SLUICE_TASK=score)")  # fmt: skip
    tr.add_argument("--compression", choices=["None", "Gzip"], default="None",
                    help="CompressionType of the input objects")  # fmt: skip
    tr.add_argument(
        "--invocation-timeout",
        type=int,
        default=600,
        help="seconds per request (ModelClientConfig.InvocationsTimeoutInSeconds)",
    )
    tr.add_argument(
        "--max-retries",
        type=int,
        default=3,
        help="retries of a failed request (ModelClientConfig.InvocationsMaxRetries)",
    )
    tr.add_argument("--capture-uri", help="DataCaptureConfig.DestinationS3Uri: write batch "
                    "capture manifests (input/, output/) there")  # fmt: skip
    tr.add_argument("--summary", help="also write the job's summary (JSON) to this file")
    tr.add_argument("--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    tr.set_defaults(func=cmd_transform)

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
    m.add_argument("--fail-on-violations", action="store_true", help="exit 2 on violations")
    m.add_argument(
        "--reference-outputs",
        type=int,
        default=200,
        help="baseline: training prompts the model answers as the output reference",
    )
    m.set_defaults(func=cmd_monitor)

    lo = sub.add_parser(
        "local",
        help="the whole application on this machine: `sluice local up`, `sluice local demo`",
        description="Local Sluice (no AWS account): see `sluice local --help`.",
        add_help=False,
    )
    lo.set_defaults(func=cmd_local)

    d = sub.add_parser(
        "demo",
        help="train a tiny model on the embedded corpus and show what it predicts",
        description="From nothing: generate the embedded corpus, train a tiny model (about a "
        "minute on 2 cores), evaluate it, export it, and print next-word predictions.",
    )
    d.add_argument("--workdir", default="sluice-demo", help="where the demo writes its files")
    d.add_argument("--steps", type=int, default=300, help="training steps")
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)  # `local` takes everything after it, --help too
    if rest and args.command != "local":
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    setup_logging(args.log_level)
    try:
        return args.func(args, argv)
    except SluiceError as e:
        log.error("%s", e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
