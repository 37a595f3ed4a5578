"""The stack's CloudWatch dashboard on one machine: one HTML page, the same widgets.

The page is rendered from what the local stack deployed and recorded: template.yaml's dashboard
body as the local CloudWatch holds it (`sluice-<stage>`), each metric widget's series from the
local CloudWatch's data (the functions' EMF metrics, Lambda's and SQS's own) drawn with Plotly
(its JavaScript inlined: the page works offline), then the latest drift report's plots and the
last retrain's decision. `sluice-local dashboard` writes it; `sluice-local demo` ends with it.
"""

from __future__ import annotations

import base64
import html
import json
import re
import time
from datetime import UTC, datetime

from .alarms import bucketed, statistic

ROW_PX = 42  # one grid unit of height (CloudWatch's grid is 24 units wide)


def render(client, stage: str, bucket: str, hours: float = 3.0, period_s: int = 60) -> str:
    """The page: `client(service)` is a boto3 client on the local stack."""
    import plotly.graph_objects as go
    from plotly.offline import get_plotlyjs

    name = f"sluice-{stage}"
    body = json.loads(client("cloudwatch").get_dashboard(DashboardName=name)["DashboardBody"])
    now = time.time()
    start = now - hours * 3600
    # the charts' time axis: from the first datapoint (a short run fills the width), at most
    # `hours` back
    rows = {
        (i, j): _metric(row, w["properties"])
        for i, w in enumerate(body["widgets"])
        if w["type"] == "metric"
        for j, row in enumerate(w["properties"].get("metrics", []))
    }
    series = {key: _series(*row[:4], start, now, period_s) for key, row in rows.items()}
    firsts = [_epoch(xs[0]) for xs, _ in series.values() if xs]
    shown_from = max(start, min(firsts) - period_s) if firsts else start
    cells = []
    for i, w in enumerate(body["widgets"]):
        place = (
            f"grid-column: {w.get('x', 0) + 1} / span {w.get('width', 6)}; "
            f"grid-row: {w.get('y', 0) + 1} / span {w.get('height', 6)}"
        )
        props = w.get("properties", {})
        if w["type"] == "text":
            cells.append(f'<div class="text" style="{place}">{_markdown(props["markdown"])}</div>')
            continue
        fig = go.Figure()
        points = 0
        for j in range(len(props.get("metrics", []))):
            _, metric, dims, _, opts = rows[(i, j)]
            xs, ys = series[(i, j)]
            points += len(xs)
            label = opts.get("label") or " ".join([metric, *_short(dims)])
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    name=label,
                    mode="lines+markers",
                    yaxis="y2" if opts.get("yAxis") == "right" else "y",
                )
            )
        fig.update_layout(
            title={"text": props.get("title", ""), "font": {"size": 13}},
            height=w.get("height", 6) * ROW_PX,
            margin={"l": 40, "r": 40, "t": 30, "b": 20},
            legend={"orientation": "h", "font": {"size": 9}},
            yaxis2={"overlaying": "y", "side": "right"},
            xaxis={"range": [_utc(shown_from), _utc(now)]},
            template="plotly_white",
        )
        if not points:
            fig.add_annotation(text="no data", showarrow=False, xref="paper", yref="paper")
        chart = fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            div_id=f"widget-{i}",
            config={"displayModeBar": False, "responsive": True},
        )
        cells.append(f'<div class="chart" data-points="{points}" style="{place}">{chart}</div>')
    drift = _drift_report(client, bucket)
    retrain = _last_retrain(client, stage)
    generated = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{name}: Sluice on this machine</title>
<script>{get_plotlyjs()}</script>
<style>
body {{ font-family: sans-serif; margin: 16px; color: #16191f; }}
.grid {{ display: grid; grid-template-columns: repeat(24, 1fr);
         grid-auto-rows: {ROW_PX}px; gap: 6px; }}
.chart, .text {{ border: 1px solid #d5dbdb; border-radius: 4px; overflow: hidden; }}
.text {{ padding: 4px 10px; background: #f2f3f3; }} .text h2 {{ margin: 2px 0; font-size: 17px; }}
.text p {{ margin: 2px 0; font-size: 13px; }} section {{ margin-top: 18px; }}
img {{ max-width: 48%; margin: 4px; border: 1px solid #d5dbdb; }}
pre {{ background: #f7f7f7; padding: 8px; white-space: pre-wrap; }}
</style></head><body>
<h1>Dashboard {name}</h1>
<p>template.yaml's CloudWatch dashboard, from the local stack's metrics: the last {hours:g} h
in periods of {period_s} s (CloudWatch on AWS: the widget's own period). Generated {generated}.</p>
<div class="grid">
{chr(10).join(cells)}
</div>
<section id="retrain"><h2>Last retrain</h2>{retrain}</section>
<section id="drift"><h2>Latest drift report</h2>{drift}</section>
</body></html>
"""


def _metric(row: list, props: dict) -> tuple[str, str, dict[str, str], str, dict]:
    """(namespace, name, dimensions, statistic, rendering options) of one row of a metric
    widget (the row's stat, else the widget's)."""
    strings = [x for x in row if isinstance(x, str)]
    opts = row[-1] if isinstance(row[-1], dict) else {}
    dims = dict(zip(strings[2::2], strings[3::2], strict=True))
    return strings[0], strings[1], dims, opts.get("stat", props.get("stat", "Average")), opts


def _epoch(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def _series(namespace, name, dims, stat, start, end, period) -> tuple[list, list]:
    buckets = bucketed(namespace, name, dims, start, end, period)
    keys = sorted(buckets)
    return [_utc(k) for k in keys], [statistic(stat, buckets[k]) for k in keys]


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _short(dims: dict[str, str]) -> list[str]:
    """A dimension value as a legend shows it: a queue or function name without the stack's
    prefix; a service dimension says nothing the title does not."""
    return [
        re.sub(r"^sluice-[a-z0-9-]+?-(?=[a-z])", "", v)
        for k, v in dims.items()
        if k in ("QueueName", "FunctionName")
    ]


def _markdown(text: str) -> str:
    """The text widgets' markdown: headings, paragraphs, `code` and *emphasis*."""
    out = []
    for line in text.splitlines():
        safe = html.escape(line)
        safe = re.sub(r"`([^`]+)`", r"<code>\1</code>", safe)
        safe = re.sub(r"\*([^*]+)\*", r"<em>\1</em>", safe)
        heading = re.match(r"^(#+) (.*)$", safe)
        out.append(f"<h2>{heading[2]}</h2>" if heading else f"<p>{safe}</p>")
    return "".join(out)


def _last_retrain(client, stage: str) -> str:
    sfn = client("stepfunctions")
    machines = [
        m
        for m in sfn.list_state_machines()["stateMachines"]
        if m["name"] == f"sluice-{stage}-retrain"
    ]
    if not machines:
        return "<p>no retrain state machine</p>"
    runs = sfn.list_executions(stateMachineArn=machines[0]["stateMachineArn"])["executions"]
    done = [r for r in runs if r["status"] != "RUNNING"]
    if not done:
        return "<p>no retrain has finished yet</p>"
    last = max(done, key=lambda r: r["startDate"])
    d = sfn.describe_execution(executionArn=last["executionArn"])
    output = json.loads(d.get("output") or "{}")
    facts = {
        "execution": d["name"],
        "status": d["status"],
        "outcome": output.get("outcome", d.get("error", "")),
        "training job": output.get("trainingJob", ""),
        "ended": str(d.get("stopDate", "")),
    }
    rows = "".join(f"<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts.items())
    return f'<table class="retrain">{rows}</table>'


def _drift_report(client, bucket: str) -> str:
    s3 = client("s3")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="monitoring/")
    reports = [
        o for page in pages for o in page.get("Contents", []) if o["Key"].endswith("/report.md")
    ]
    if not reports:
        return "<p>no drift report yet</p>"
    latest = max(reports, key=lambda o: o["LastModified"])
    folder = latest["Key"].rsplit("/", 1)[0] + "/"
    text = s3.get_object(Bucket=bucket, Key=latest["Key"])["Body"].read().decode()
    images = []
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=folder).get("Contents", [])
    for o in sorted(listed, key=lambda o: o["Key"]):
        if o["Key"].endswith(".png"):
            data = base64.b64encode(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
            images.append(
                f'<img alt="{html.escape(o["Key"])}" src="data:image/png;base64,{data.decode()}">'
            )
    return (
        f"<p>s3://{bucket}/{html.escape(folder)}</p>{''.join(images)}<pre>{html.escape(text)}</pre>"
    )
