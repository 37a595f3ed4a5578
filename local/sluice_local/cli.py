"""`sluice local ...`: the whole application on this machine (see `sluice local --help`)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path

from .template import TemplateError, parse_overrides

DEFAULT_STATE = Path("sluice-local")
DEFAULT_PORT = 5055


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sluice local",
        description="Sluice on this machine, no AWS account: template.yaml deployed on local AWS "
        "APIs (moto), a local SageMaker running the container's commands, the Lambda handlers "
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

    sched = sub.add_parser("schedule", help="fire a schedule now (e.g. the retrain sweep)")
    sched.add_argument("name", help="schedule name (see `sluice local status`)")
    sched.add_argument("--endpoint", default=f"http://127.0.0.1:{DEFAULT_PORT}")
    return p


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
        "--parameter-overrides",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="template parameters, after samconfig.toml's",
    )


def _stack(args):
    from .stack import REPO, LocalStack

    return LocalStack(
        args.state,
        port=args.port,
        host=args.host,
        template=args.template or REPO / "template.yaml",
        overrides=parse_overrides(args.parameter_overrides),
        config_env=args.config_env,
    )


def cmd_up(args) -> int:
    stack = _stack(args).start()
    if args.ready_file:
        args.ready_file.write_text(json.dumps({"endpoint": stack.url, **stack.status()}))
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        stack.wait_forever()
    finally:
        stack.stop()
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


def _get(endpoint: str, path: str, method: str = "GET") -> dict:
    req = urllib.request.Request(endpoint.rstrip("/") + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{method} {path}: {json.loads(e.read()).get('message', e)}") from None
    except urllib.error.URLError as e:
        raise SystemExit(
            f"no local Sluice at {endpoint} ({e.reason}): start it with `sluice local up`"
        ) from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "up":
            return cmd_up(args)
        if args.command == "demo":
            return cmd_demo(args)
        if args.command == "schedule":
            print(json.dumps(_get(args.endpoint, f"/_sluice/schedules/{args.name}", "POST")))
            return 0
        path = {"status": "/_sluice/status", "notifications": "/_sluice/notifications"}
        print(json.dumps(_get(args.endpoint, path[args.command]), indent=2))
        return 0
    except TemplateError as e:
        print(f"sluice local: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
