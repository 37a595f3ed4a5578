"""OpenAI batch request lines to records, results to batch output lines (no model needed)."""

from __future__ import annotations

import io
import json

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from sluice.openai_batch import Request, output_line
from sluice.records import BadRecord, Defaults, Record, parse_body
from sluice_functions.reports import count_lines, errors_key


def line(url="/v1/chat/completions", cid="r-1", **body) -> dict:
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def parse(*lines, defaults=None) -> list[Record | BadRecord]:
    text = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines)
    return list(parse_body(text.encode(), "application/jsonlines", defaults or Defaults()))


CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_chat_and_completion_lines_become_records_with_openais_defaults():
    chat, comp = parse(
        line(messages=CHAT, max_tokens=8, temperature=0, stop="x", seed=3),
        line("/v1/completions", "r-2", prompt="The cat", echo=True, logprobs=2),
    )
    assert chat.task == "chat" and chat.messages == CHAT and chat.openai.custom_id == "r-1"
    assert chat.params["max_new_tokens"] == 8 and chat.params["do_sample"] is False
    assert chat.params["stop"] == ["x"] and chat.params["truncation"] == "error"
    assert comp.task == "generate" and comp.text == "The cat" and comp.openai.echo == "The cat"
    # /v1/completions' documented max_tokens default is 16, temperature 1 (sampling)
    assert comp.params["max_new_tokens"] == 16 and comp.params["do_sample"] is True
    assert comp.params["temperature"] == 1.0 and comp.params["logprobs"] == 2
    # chat without max_tokens: as many as the context leaves (engine._fit sets it)
    (open_ended,) = parse(
        line(messages=[{"role": "user", "content": [{"type": "text", "text": "a"}]}])
    )
    assert open_ended.params["max_new_tokens"] is None and open_ended.messages[0]["content"] == "a"


def json_schema(schema, name="answer") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_response_format_is_the_native_json_schema_parameter():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    free, obj, strict = parse(
        line(messages=CHAT, response_format={"type": "text"}),
        line(messages=CHAT, response_format={"type": "json_object"}),
        line(messages=CHAT, response_format=json_schema(schema)),
    )
    assert "json_schema" not in free.params
    assert obj.params["json_schema"] == {"type": "object"}
    assert strict.params["json_schema"] == schema
    (native,) = parse({"text": "a", "parameters": {"json_schema": schema}})
    assert native.params["json_schema"] == schema


def test_an_absent_temperature_is_the_models_default_as_in_vllm():
    (rec,) = parse(
        line(messages=CHAT), defaults=Defaults(params={"generate": {"temperature": 0.0}})
    )
    assert rec.params["temperature"] == 0.0 and rec.params["do_sample"] is False


@pytest.mark.parametrize(
    ("request_line", "code"),
    [
        (line("/v1/embeddings", input="x"), "invalid_url"),
        ({**line(messages=CHAT), "method": "GET"}, "invalid_request"),
        ({**line(messages=CHAT), "extra": 1}, "invalid_request"),
        (line(messages=CHAT, tools=[]), "unsupported_parameter"),
        (line(messages=CHAT, stream=True), "unsupported_parameter"),
        (line(messages=CHAT, response_format={"type": "xml"}), "invalid_parameter"),
        (line(messages=CHAT, response_format={"type": "json_schema"}), "invalid_parameter"),
        (line(messages=CHAT, response_format=json_schema({"type": "nope"})), "invalid_parameter"),
        (line(messages=CHAT, response_format=json_schema({}, name="a b")), "invalid_parameter"),
        (line(messages=CHAT, max_tokens=2, max_completion_tokens=2), "invalid_request"),
        (line(messages=CHAT, temperature=3), "invalid_parameter"),
        (line(messages=CHAT, top_logprobs=2), "invalid_parameter"),
        (line(messages=CHAT, n=2, temperature=0), "invalid_parameter"),
        (line(messages=CHAT, max_tokens=0), "invalid_parameter"),
        (line(messages=[]), "invalid_request"),
        (
            line(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
            "unsupported_content",
        ),
        (line("/v1/completions", prompt=["a", "b"]), "invalid_request"),
        (line("/v1/completions", prompt="a", logprobs=6), "invalid_parameter"),
        (line("/v1/completions", prompt="a", best_of=2), "unsupported_parameter"),
        (line("/v1/completions", prompt=""), "empty_text"),
        (
            {"custom_id": 5, "method": "POST", "url": "/v1/completions", "body": {}},
            "invalid_request",
        ),
    ],
)
def test_a_request_openai_would_refuse_is_that_lines_error(request_line, code):
    (bad,) = parse(request_line)
    assert isinstance(bad, BadRecord) and bad.code == code, bad
    assert bad.openai is not None
    out = output_line(bad.openai, {"error": {"code": bad.code, "message": bad.message}})
    cid = request_line["custom_id"]
    assert out["custom_id"] == (cid if isinstance(cid, str) else None)
    assert out["response"]["status_code"] == 400 and out["error"] is None
    assert out["response"]["body"]["error"]["code"] == code


def test_unreadable_lines_of_an_openai_file_answer_in_its_shape():
    recs = parse(
        "{not json",
        line(messages=CHAT),
        "{also not json",
        '{"custom_id": "r-9", "method": "POST", "url": "/v1/completions", "body": {"n": NaN}}',
        {"text": "a native record still runs"},
        {"id": "n-1", "text": "a", "parameters": {"bogus": 1}},
    )
    assert recs[0].openai is None  # before the first request line: a native error line
    assert recs[2].openai == Request() and recs[2].code == "invalid_json"
    assert recs[3].openai.custom_id == "r-9" and recs[3].code == "invalid_json"
    assert isinstance(recs[4], Record) and recs[4].openai is None
    # a native line with an id: its error line is native, with its id
    assert recs[5].openai is None and recs[5].id == "n-1" and recs[5].code == "invalid_parameter"


def test_results_are_valid_chat_completion_and_text_completion_bodies():
    usage = {"usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}
    gen = {"generated_text": " the", "tokens": 2, "finish_reason": "eos", "mean_logprob": -1.0}
    lps = [
        {
            "token": " t",
            "id": 4,
            "logprob": -0.5,
            "top": [{"token": " t", "id": 4, "logprob": -0.5}],
        },
        {
            "token": "he",
            "id": 9,
            "logprob": -1.5,
            "top": [{"token": "he", "id": 9, "logprob": -1.5}],
        },
    ]
    chat = output_line(
        Request("a", "/v1/chat/completions", "m"),
        {"task": "chat", **gen, "logprobs": lps, **usage},
    )
    assert chat["custom_id"] == "a" and chat["response"]["status_code"] == 200
    body = ChatCompletion.model_validate(chat["response"]["body"])
    assert body.choices[0].message.content == " the" and body.choices[0].finish_reason == "stop"
    assert [t.token for t in body.choices[0].logprobs.content] == [" t", "he"]
    assert body.usage.total_tokens == 8 and body.model == "m"

    two = {**gen, "generations": [gen, {**gen, "generated_text": "x", "finish_reason": "length"}]}
    comp = output_line(Request("b", "/v1/completions", None, echo="The"), {**two, **usage})
    body = Completion.model_validate(comp["response"]["body"])
    assert [c.text for c in body.choices] == ["The the", "Thex"]
    assert [c.finish_reason for c in body.choices] == ["stop", "length"]
    failed = output_line(Request("c"), {"error": {"code": "engine_failed", "message": "m"}})
    assert failed["response"]["status_code"] == 503
    assert failed["response"]["body"]["error"]["type"] == "server_error"


def test_the_failed_requests_of_an_output_are_its_error_file():
    ok = output_line(
        Request("a", "/v1/completions"),
        {"generated_text": "x", "finish_reason": "length", "usage": {}},
    )
    bad = output_line(Request("b"), {"error": {"code": "too_long", "message": "m"}})
    native_error = {"id": 3, "error": {"code": "empty_text", "message": "m"}}
    body = "\n".join(json.dumps(x, separators=(",", ":")) for x in (ok, bad, native_error)).encode()
    failed = io.BytesIO()
    chunks = [body[i : i + 7] for i in range(0, len(body), 7)]
    assert count_lines(chunks, failed).error_lines == 2
    assert [json.loads(x)["custom_id"] for x in failed.getvalue().splitlines()] == ["b"]
    assert (
        errors_key("outputs/j/team-a/batch.jsonl.out")
        == "outputs/j/team-a/batch.jsonl.errors.jsonl"
    )


def test_the_readmes_openai_line_is_a_chat_request():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    shown = [x for x in readme.splitlines() if x.startswith('{"custom_id"')]
    assert shown and all(isinstance(r, Record) and r.task == "chat" for r in parse(*shown))


def test_the_readmes_json_schema_line_is_a_structured_record():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    (shown,) = [x for x in readme.splitlines() if '"json_schema"' in x and x.startswith("{")]
    (rec,) = parse(shown)
    assert isinstance(rec, Record) and rec.params["json_schema"]["required"] == ["deep"]


def test_a_record_picks_a_named_adapter_and_an_openai_line_by_its_model():
    with_adapters = Defaults(adapters=("legal", "support-v2"))
    native, openai, other_model, unknown = parse(
        {"id": 1, "text": "a", "adapter": "legal"},
        line("/v1/completions", prompt="a", model="support-v2"),
        line("/v1/completions", prompt="a", model="gpt-4o-mini"),  # not an adapter: the model
        {"id": 2, "text": "a", "adapter": "nope"},
        defaults=with_adapters,
    )
    assert native.adapter == "legal" and openai.adapter == "support-v2"
    assert other_model.adapter is None and other_model.openai.model == "gpt-4o-mini"
    assert unknown.code == "unknown_adapter" and "legal, support-v2" in unknown.message
    (none,) = parse({"text": "a", "adapter": "legal"})  # a model without adapters
    assert none.code == "unknown_adapter" and "none" in none.message
