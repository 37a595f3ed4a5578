"""`sluice-local ...`: Sluice on this machine with no AWS account (see `sluice-local --help`).

`up`/`demo` run the whole application (template.yaml on local AWS APIs); `transform` is SageMaker's
side of a Batch Transform against the image's real `sluice serve`; `quickstart` trains and
transforms with no AWS APIs at all.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from sluice.cli import parse_sets, setup_logging, top_parser
from sluice.errors import ExitCode, SluiceError

from .template import TemplateError, parse_overrides

DEFAULT_STATE = Path("sluice-local")
DEFAULT_PORT = 5055


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = top_parser(
        "sluice-local",
        __version__,
        "Sluice on this machine, no AWS account: template.yaml deployed on local AWS APIs "
        "(moto), a local SageMaker running the container's commands, the Lambda handlers "
        "in-process. State (buckets, models, history) lives in one folder and survives restarts.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start local Sluice and log every event, invocation and job")
    _stack_args(up)
    up.add_argument("--ready-file", type=Path, help="write the endpoint here once it is up")

    demo = sub.add_parser(
        "demo", help="from nothing: train, promote, predict, drift, retrain, swap"
    )
    _stack_args(demo, state=Path("sluice-demo/local"), port=0)
    demo.add_argument("--steps", type=int, default=300, help="training steps of the first model")
    demo.add_argument(
        "--keep", action="store_true", help="keep earlier demo state (else start fresh)"
    )

    for name, text in (
        ("status", "what a running local Sluice holds (outputs, functions, ...)"),
        ("notifications", "the SNS notifications it published"),
    ):
        s = sub.add_parser(name, help=text)
        s.add_argument("--endpoint", default=f"http://127.0.0.1:{DEFAULT_PORT}")

    dash = sub.add_parser(
        "dashboard",
        help="write the stack's CloudWatch dashboard, drawn from its metrics, as one HTML page",
    )
    dash.add_argument("--endpoint", default=f"http://127.0.0.1:{DEFAULT_PORT}")
    dash.add_argument("--output", type=Path, default=Path("sluice-dashboard.html"))
    dash.add_argument("--hours", type=float, default=3.0, help="how far back (default 3)")

    sched = sub.add_parser("schedule", help="fire a schedule now (e.g. the retrain sweep)")
    sched.add_argument("name", help="schedule name (see `sluice-local status`)")
    sched.add_argument("--endpoint", default=f"http://127.0.0.1:{DEFAULT_PORT}")

    _transform_parser(sub)
    q = sub.add_parser(
        "quickstart",
        help="no AWS APIs at all: train a tiny model, batch-transform sample prompts (~1 min)",
        description="Generate the embedded corpus, train a tiny GPT-2 with the container's "
        "`sluice train`, evaluate it, and run a Batch Transform of two prompt files through its "
        "real `sluice serve`.",
    )
    q.add_argument("--workdir", default="sluice-demo", help="where it writes its files")
    q.add_argument("--steps", type=int, default=300, help="training steps")
    pl = sub.add_parser(
        "plan",
        help="memory per GPU for a fine-tune, and the SageMaker instance types it fits",
        description="Estimate weights, gradients, AdamW state and activations per GPU for "
        "`sluice train` with these settings, from the model's config alone (nothing is "
        "downloaded or allocated), and list the SageMaker GPU instance types on which it fits.",
    )
    pl.add_argument("--model", required=True, help="model folder or its config.json")
    pl.add_argument("--method", choices=("full", "lora"), default="full")
    pl.add_argument("--distributed", choices=("ddp", "fsdp"), default="ddp")
    pl.add_argument("--instance-type", help="e.g. ml.g5.12xlarge (default: one GPU, bfloat16)")
    pl.add_argument("--instance-count", type=int, default=1)
    pl.add_argument("--batch-size", type=int, default=1, help="blocks per GPU per micro-step")
    pl.add_argument("--block-size", type=int, default=2048, help="tokens per block")
    pl.add_argument("--activation-checkpointing", action="store_true")
    pl.add_argument("--lora-r", type=int, default=8)
    pl.add_argument("--lora-target-modules", default="")
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def _transform_parser(sub) -> None:
    tr = sub.add_parser(
        "transform",
        help="a Batch Transform on this machine against the real `sluice serve`",
        description="SageMaker Batch Transform semantics on this machine: inputs from a folder, "
        "an s3:// prefix (AWS_ENDPOINT_URL or --endpoint-url for moto/LocalStack) or a manifest; "
        "outputs <key>.out under --output. The local SageMaker runs its transform jobs with it.",
    )
    serving = tr.add_mutually_exclusive_group(required=True)
    serving.add_argument("--model", help="model folder (save_pretrained layout)")
    serving.add_argument(
        "--container-url",
        help="a container that already serves (e.g. a `sluice serve` started with "
        "SAGEMAKER_BATCH=true) instead of one started for the job: try settings without a start "
        "each time; --env does not apply",
    )
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
    tr.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment for the serve process (e.g. SLUICE_TASK=score)",
    )
    tr.add_argument(
        "--compression",
        choices=["None", "Gzip"],
        default="None",
        help="CompressionType of the input objects",
    )
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
    tr.add_argument(
        "--capture-uri",
        help="DataCaptureConfig.DestinationS3Uri: write batch capture manifests there",
    )
    tr.add_argument("--summary", help="also write the job's summary (JSON) to this file")
    tr.add_argument("--endpoint-url", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    tr.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        help="progress bar on stderr (default: when stderr is a terminal)",
    )


def cmd_transform(args) -> int:
    from sluice.cli import show_progress

    from .transform import TransformConfig, run_transform

    cfg = TransformConfig(
        content_type=args.content_type,
        accept=args.accept,
        split_type=args.split_type,
        strategy=args.strategy,
        max_payload_mb=args.max_payload_mb,
        concurrency=args.max_concurrent_transforms,
        assemble_with=args.assemble_with,
        join_source=args.join_source,
        env=parse_sets(args.env),
        compression=args.compression,
        capture_uri=args.capture_uri,
        timeout_s=args.invocation_timeout,
        max_retries=args.max_retries,
    )
    summary = run_transform(
        Path(args.model) if args.model else None,
        args.input,
        args.output,
        cfg,
        manifest=args.manifest,
        endpoint_url=args.endpoint_url,
        progress=show_progress(args),
        container_url=args.container_url,
    )
    print(json.dumps(summary, indent=2))
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=2))
    return ExitCode.OK if summary["TransformJobStatus"] == "Completed" else ExitCode.FAILED


def _stack_args(
    p: argparse.ArgumentParser, state: Path = DEFAULT_STATE, port: int = DEFAULT_PORT
) -> None:
    p.add_argument("--state", type=Path, default=state, help=f"state folder (default {state})")
    p.add_argument("--port", type=int, default=port, help="port of the local AWS endpoint (0: any)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--template", type=Path, help="SAM template (default: the repository's)")
    p.add_argument(
        "--config-env",
        default="local",
        help="samconfig.toml environment whose parameter_overrides apply",
    )
    p.add_argument(
        "--durability",
        choices=["acknowledged", "periodic"],
        default="acknowledged",
        help="acknowledged: a change is on disk before it is answered (survives kill -9); "
        "periodic: snapshots every 10 s only (faster, a crash loses up to 10 s)",
    )
    p.add_argument(
        "--quota",
        action="append",
        default=[],
        metavar="'TYPE for KIND job usage=N'",
        help="a SageMaker account quota as Service Quotas names it, e.g. "
        "'ml.g5.xlarge for transform job usage=1' (repeatable; default: transform jobs 2 "
        "instances of each type, training and processing unlimited)",
    )
    p.add_argument(
        "--no-capacity",
        action="append",
        default=[],
        metavar="TYPE=N",
        help="the next N transform jobs on instance type TYPE fail as SageMaker fails a job it "
        "finds no instances for (CapacityError), e.g. ml.g5.xlarge=2 (repeatable)",
    )
    p.add_argument(
        "--parameter-overrides",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="template parameters, after samconfig.toml's",
    )


def _stack(args):
    from .sagemaker import quotas
    from .stack import REPO, LocalStack

    return LocalStack(
        args.state,
        port=args.port,
        host=args.host,
        template=args.template or REPO / "template.yaml",
        overrides=parse_overrides(args.parameter_overrides),
        config_env=args.config_env,
        durability=args.durability,
        quotas=_parsed(quotas.parse, args.quota),
        no_capacity=_parsed(quotas.parse_capacity, args.no_capacity),
    )


def _parsed(parse, specs: list[str]) -> dict[str, int]:
    try:
        return parse(specs)
    except ValueError as e:
        raise SystemExit(f"sluice-local: {e}") from None


def cmd_up(args) -> int:
    from .allocator import limit_arenas

    limit_arenas()  # before the stack's threads start (allocator.py: why)
    stack = _stack(args).start()
    if args.ready_file:
        args.ready_file.write_text(json.dumps({"endpoint": stack.url, **stack.status()}))
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # Ctrl-C stops it even when started in the background of a script (`sluice-local up &`),
    # where the shell starts it with SIGINT ignored and Python then never raises KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        stack.wait_forever()
    finally:
        stack.stop()
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


def _get(endpoint: str, path: str, method: str = "GET", raw: bool = False):
    req = urllib.request.Request(endpoint.rstrip("/") + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.read() if raw else json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {path}: {json.loads(e.read()).get('message', e)}") from None
    except urllib.error.URLError as e:
        raise SystemExit(
            f"no local Sluice at {endpoint} ({e.reason}): start it with `sluice-local up`"
        ) from None


def main(argv: list[str] | None = None) -> int:
    """Run one command; the exit status is an ExitCode (see `sluice-local --help`)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "up":
            return cmd_up(args)
        if args.command == "demo":
            return cmd_demo(args)
        if args.command in ("transform", "quickstart"):
            setup_logging(args.log_level)
            if args.command == "transform":
                return cmd_transform(args)
            from .quickstart import run_quickstart

            return run_quickstart(Path(args.workdir), steps=args.steps)
        if args.command == "plan":
            from .plan import run

            print(run(args))
            return 0
        if args.command == "dashboard":
            page = _get(args.endpoint, f"/_sluice/dashboard?hours={args.hours:g}", raw=True)
            args.output.write_bytes(page)
            print(args.output.resolve())
            return 0
        if args.command == "schedule":
            print(json.dumps(_get(args.endpoint, f"/_sluice/schedules/{args.name}", "POST")))
            return 0
        path = {"status": "/_sluice/status", "notifications": "/_sluice/notifications"}
        print(json.dumps(_get(args.endpoint, path[args.command]), indent=2))
        return 0
    except (TemplateError, SluiceError) as e:
        print(f"sluice-local: {e}", file=sys.stderr)
        return ExitCode.FAILED
    except KeyboardInterrupt:
        return ExitCode.CTRL_C


if __name__ == "__main__":
    sys.exit(main())
