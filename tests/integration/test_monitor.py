"""`sluice monitor`: real statistics on real text, Model Monitor's formats, capture parsing."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from sluice import monitor
from tests.helpers import REPO, read_json, run_sluice

LATIN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
CYRILLIC = "абцдефгхийклмнопярстужвьызАБЦДЕФГХИЙКЛМНОПЯРСТУЖВЬЫЗ"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, trained, corpus_dir) -> Path:
    out = tmp_path_factory.mktemp("baseline")
    monitor.run_baseline([corpus_dir / "train"], trained["model"], out)
    return out


def run(window: Path, baseline: Path, model: Path, out: Path) -> dict:
    return monitor.run_monitor(
        [window], baseline / "statistics.json", baseline / "constraints.json", model, out
    )


def test_baseline_suggests_a_check_per_measure_with_its_noise_calibration(baseline):
    stats, constraints = (
        read_json(baseline / "statistics.json"),
        read_json(baseline / "constraints.json"),
    )
    assert stats["dataset"]["item_count"] == 3000
    # the champion's own outputs on 200 training prompts: the output-side reference
    assert stats["dataset"]["outputs"] == monitor.REFERENCE_OUTPUTS
    checks = {f["name"]: f["drift_check"] for f in constraints["features"]}
    assert checks == {
        name: {"method": m, "threshold": t} for name, (m, t) in monitor.DEFAULT_THRESHOLDS.items()
    }
    assert (baseline / "tokenizer" / "tokenizer.json").exists()
    noise = stats["calibration"]["max_distance"]["token_distribution"]
    sizes = sorted(int(k) for k in noise)
    assert sizes[0] == 25 and sizes[-1] == 1000
    # sampling noise falls as windows grow
    assert noise[str(sizes[0])] > noise[str(sizes[-1])]


def test_held_out_sample_of_the_same_distribution_has_no_violations(
    baseline, trained, corpus_dir, tmp_path
):
    result = run(corpus_dir / "heldout", baseline, trained["model"], tmp_path)
    assert result["violations"] == [], result["checks"]
    assert {c["feature_name"] for c in result["checks"]} == {
        "token_distribution",
        "record_length",
        "byte_fallback_rate",
        "script_mix",
    }
    assert read_json(tmp_path / "constraint_violations.json") == {"violations": []}
    assert result["message"].startswith("Completed: no violations")


def test_source_code_instead_of_prose_is_drift(baseline, trained, tmp_path):
    code = tmp_path / "window" / "code.txt"
    code.parent.mkdir()
    lines = [
        x
        for p in sorted((REPO / "container" / "sluice").glob("*.py"))
        for x in p.read_text().splitlines()
        if x.strip()
    ]
    code.write_text("\n".join(lines[:1500]) + "\n")
    result = run(code.parent, baseline, trained["model"], tmp_path / "out")
    moved = {v["feature_name"] for v in result["violations"]}
    assert {"token_distribution", "script_mix", "byte_fallback_rate"} <= moved
    for v in result["violations"]:
        assert v["constraint_check_type"] == "baseline_drift_check"
        assert re.fullmatch(r"distance: \d+\.\d{4} exceeds threshold: \d+\.\d{4}", v["description"])
    doc = read_json(tmp_path / "out" / "constraint_violations.json")
    assert doc["violations"] == result["violations"]
    report = (tmp_path / "out" / "report.md").read_text()
    assert "violation(s)" in report and "![token_distribution.png]" in report
    assert (tmp_path / "out" / "token_distribution.png").stat().st_size > 1000


def test_another_script_is_drift_in_bytes_and_characters(baseline, trained, corpus_dir, tmp_path):
    window = tmp_path / "window"
    window.mkdir()
    text = (corpus_dir / "heldout" / "eval.txt").read_text()
    (window / "ru.txt").write_text(text.translate(str.maketrans(LATIN, CYRILLIC)))
    result = run(window, baseline, trained["model"], tmp_path / "out")
    moved = {v["feature_name"] for v in result["violations"]}
    assert {"byte_fallback_rate", "script_mix", "token_distribution"} <= moved


def test_a_window_below_min_records_is_not_checked(baseline, trained, corpus_dir, tmp_path):
    window = tmp_path / "window"
    window.mkdir()
    lines = (corpus_dir / "heldout" / "eval.txt").read_text().splitlines()[:40]
    (window / "few.txt").write_text("\n".join(lines) + "\n")
    result = run(window, baseline, trained["model"], tmp_path / "out")
    assert result["violations"] == [] and result["checks"] == []
    assert "fewer than min_records" in result["note"]


def capture_line(body: bytes, out: bytes, encoding: str = "JSON") -> str:
    def part(data: bytes, ctype: str, mode: str) -> dict:
        text = base64.b64encode(data).decode() if encoding == "BASE64" else data.decode()
        return {"observedContentType": ctype, "mode": mode, "data": text, "encoding": encoding}

    return json.dumps(
        {
            "captureData": {
                "endpointInput": part(body, "application/jsonlines", "INPUT"),
                "endpointOutput": part(out, "application/jsonlines", "OUTPUT"),
            },
            "eventMetadata": {"eventId": "e1", "inferenceTime": "2026-12-02T10:00:00Z"},
            "eventVersion": "0",
        }
    )


def test_capture_files_in_both_encodings_multi_record_bodies_and_bad_lines():
    body = b'{"text": "the cat sat"}\n{"inputs": "a dog ran", "task": "generate"}\n'
    out = (
        b'{"generated_text": " on", "tokens": 3, "mean_logprob": -1.5}\n'
        b'{"generated_text": " far", "tokens": 5, "mean_logprob": -2.0}\n'
    )
    window = monitor.Window()
    for line in [
        capture_line(body, out),
        capture_line(body, out, "BASE64"),
        '{"text": "plain json lines work too"}',
        "plain text works too",
        "{not json",
        '{"captureData": {"endpointInput": {"data": "%%%", "encoding": "BASE64"}}}',
        '{"no_text_here": 1}',
        "",
    ]:
        monitor.add_line(window, line)
    assert window.texts == ["the cat sat", "a dog ran"] * 2 + [
        "plain json lines work too",
        "plain text works too",
    ]
    assert [o["tokens"] for o in window.outputs] == [3, 5, 3, 5]
    assert window.malformed == 3


def test_transform_output_lines_are_answers_and_error_lines_are_neither():
    """Batch capture names a job's .out files: their lines are the model's answers."""
    window = monitor.Window()
    for line in [
        '{"id":"p0","task":"generate","generated_text":" fish.","tokens":2,'
        '"finish_reason":"eos","mean_logprob":-0.5}',
        '{"id":"p1","error":{"code":"invalid_json","message":"not valid JSON"}}',
        '{"id":"p2","task":"score","logprob":-3.0,"tokens":4}',
    ]:
        monitor.add_line(window, line)
    assert [o["id"] for o in window.outputs] == ["p0", "p2"]
    assert window.texts == [] and window.malformed == 0


def test_byoc_entrypoint_reads_model_monitors_environment(baseline, trained, tmp_path):
    capture = tmp_path / "capture" / "sluice-dev" / "AllTraffic" / "2026" / "12" / "02" / "10"
    capture.mkdir(parents=True)
    lines = [
        x
        for p in sorted((REPO / "functions" / "sluice_functions").glob("*.py"))
        for x in p.read_text().splitlines()
        if x.strip()
    ][:400]
    body = "".join(json.dumps({"text": x}) + "\n" for x in lines).encode()
    out = "".join(
        json.dumps({"generated_text": "x", "tokens": 4, "mean_logprob": -1.0}) + "\n" for _ in lines
    ).encode()
    (capture / "capture.jsonl").write_text(capture_line(body, out, "BASE64") + "\n{broken\n")
    env = {
        "dataset_source": str(tmp_path / "capture"),
        "output_path": str(tmp_path / "result"),
        "baseline_statistics": str(baseline / "statistics.json"),
        "baseline_constraints": str(baseline / "constraints.json"),
        "publish_cloudwatch_metrics": "Enabled",
        "endpoint_name": "sluice-dev",
        "monitoring_schedule_name": "sluice-dev-drift",
        "start_time": "2026-12-02T10:00:00Z",
        "end_time": "2026-12-02T11:00:00Z",
        "SLUICE_MODEL_DIR": str(baseline / "tokenizer"),
        "SLUICE_METRICS_DIR": str(tmp_path / "metrics"),
        "SLUICE_MESSAGE_FILE": str(tmp_path / "message"),
    }
    run_sluice("monitor", env=env)
    violations = read_json(tmp_path / "result" / "constraint_violations.json")["violations"]
    assert violations
    # the output side is checked against the champion's reference outputs
    report = (tmp_path / "result" / "report.md").read_text()
    assert "| output_length | psi |" in report and "| output_mean_logprob | psi |" in report
    stats = read_json(tmp_path / "result" / "statistics.json")
    assert stats["dataset"]["item_count"] == 400 and stats["dataset"]["malformed"] == 1
    assert (tmp_path / "message").read_text().startswith("CompletedWithViolations:")
    rows = [
        json.loads(x)
        for x in (tmp_path / "metrics" / "sluice-drift.jsonl").read_text().splitlines()
    ]
    names = {r["MetricName"] for r in rows}
    assert "feature_baseline_drift_token_distribution" in names and "violations" in names
    assert {"Name": "Endpoint", "Value": "sluice-dev"} in rows[0]["Dimensions"]


def test_byoc_entrypoint_without_its_environment_fails_with_the_reason(tmp_path):
    proc = run_sluice(
        "monitor", env={"SLUICE_MESSAGE_FILE": str(tmp_path / "message")}, check=False
    )
    assert proc.returncode == 1
    assert "dataset_source" in (tmp_path / "message").read_text()


def test_a_baseline_reads_at_most_max_records(corpus_dir):
    assert len(monitor.read_window([corpus_dir / "train"], max_records=100).texts) == 100
    assert len(monitor.read_window([corpus_dir / "train"]).texts) == 3000
