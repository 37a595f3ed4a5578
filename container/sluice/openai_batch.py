"""OpenAI batch files: request lines in, batch output lines out (docs/container.md "OpenAI batch").

A request line is `{"custom_id", "method": "POST", "url", "body"}`, the file OpenAI's and Azure
OpenAI's Batch APIs and `vllm run-batch` read. It is recognised by its content (an object with
`custom_id`, `url` or `body` and none of a native record's fields) and becomes a native `Record`
(chat or generate) that runs like any other; its result is written back as an output line:
`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}` with a
`chat.completion` or `text_completion` body, or for a failed request status 4xx/5xx and an
`{"error": {...}}` body, as OpenAI's error file has it.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

URLS = {"/v1/chat/completions": "chat", "/v1/completions": "generate"}
NATIVE_FIELDS = ("text", "inputs", "messages", "task", "parameters", "adapter")
# body fields taken per url (OpenAI's names); any other is that line's error
COMMON_FIELDS = ("model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "user")
CHAT_FIELDS = (*COMMON_FIELDS, "messages", "max_completion_tokens", "logprobs", "top_logprobs")
CHAT_FIELDS += ("response_format", "metadata", "store", "stream")
COMPLETION_FIELDS = (*COMMON_FIELDS, "prompt", "echo", "logprobs", "stream", "best_of")
# native error codes that are not the request's fault (OpenAI answers these with 5xx)
SERVER_ERRORS = {
    "engine_failed": 503,
    "deadline_exceeded": 504,
    "cancelled": 499,
    "internal_error": 500,
}
FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
CONTENT_PARTS = ("text", "input_text")
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # response_format.json_schema.name, OpenAI's rule


@dataclass
class Request:
    """What an output line needs of its request line."""

    custom_id: Any = None
    url: str | None = None
    model: str | None = None
    echo: str | None = None  # /v1/completions echo: the prompt, put before each choice's text


class Invalid(ValueError):
    """A request line OpenAI would refuse: its code and message."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def is_request(obj: Any) -> bool:
    """Whether a decoded line is an OpenAI batch request rather than a native record."""
    return (
        isinstance(obj, dict)
        and any(k in obj for k in ("custom_id", "url", "body"))
        and not any(k in obj for k in NATIVE_FIELDS)
    )


def request_of(obj: Any) -> Request:
    """The parts of a (possibly malformed) request line that its output line echoes."""
    if not isinstance(obj, dict):
        return Request()
    cid = obj.get("custom_id")
    body = obj.get("body") if isinstance(obj.get("body"), dict) else {}
    model = body.get("model")
    url = obj.get("url")
    return Request(
        cid if isinstance(cid, str) else None,
        url if isinstance(url, str) else None,
        model if isinstance(model, str) else None,
    )


def to_native(obj: dict) -> tuple[str, dict]:
    """(task, native record fields) for a request line; raises Invalid for what OpenAI refuses."""
    if not isinstance(obj.get("custom_id"), str) or not obj["custom_id"]:
        raise Invalid("invalid_request", '"custom_id" must be a non-empty string')
    extra = sorted(set(obj) - {"custom_id", "method", "url", "body"})
    if extra:
        raise Invalid("invalid_request", f"unknown request line fields {extra}")
    if obj.get("method") != "POST":
        raise Invalid("invalid_request", '"method" must be "POST"')
    url = obj.get("url")
    if url not in URLS:
        raise Invalid("invalid_url", f"unsupported url {url!r}; this server runs {sorted(URLS)}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise Invalid("invalid_request", '"body" must be a JSON object')
    chat = URLS[url] == "chat"
    allowed = CHAT_FIELDS if chat else COMPLETION_FIELDS
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise Invalid("unsupported_parameter", f"unsupported body fields {unknown} for {url}")
    if body.get("stream") not in (None, False):
        raise Invalid("unsupported_parameter", "stream is not available in a batch")
    if "model" in body and not isinstance(body["model"], str):
        raise Invalid("invalid_request", '"model" must be a string')
    params = _sampling(body, chat)
    if chat:
        return "chat", {"messages": _messages(body.get("messages")), "parameters": params}
    return "generate", {"text": _prompt(body.get("prompt")), "parameters": params}


def _sampling(body: dict, chat: bool) -> dict:
    """Native parameters for OpenAI's sampling fields (OpenAI's defaults where absent)."""
    p: dict[str, Any] = {"truncation": "error"}  # OpenAI refuses a prompt over the context
    if chat:
        if "max_tokens" in body and "max_completion_tokens" in body:
            raise Invalid("invalid_request", "send max_tokens or max_completion_tokens, not both")
        most = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        most = body.get("max_tokens", 16)  # /v1/completions' documented default
    if most is not None:  # chat without it: up to the model's context (records.py, engine._fit)
        p["max_new_tokens"] = most
    temperature = body.get("temperature")  # absent: the model's default, else 1 (records.py)
    if temperature is not None:  # its range (0-2) is records.check_param's
        p["temperature"] = temperature
        if isinstance(temperature, int | float) and not isinstance(temperature, bool):
            p["do_sample"] = temperature > 0
    for name, native in (("top_p", "top_p"), ("n", "num_return_sequences"), ("seed", "seed")):
        if body.get(name) is not None:
            p[native] = body[name]
    if body.get("stop") is not None:
        p["stop"] = body["stop"]
    if body.get("best_of") not in (None, 1):
        raise Invalid("unsupported_parameter", "best_of other than 1 is not available")
    if chat:
        top = body.get("top_logprobs")
        if top is not None and not body.get("logprobs"):
            raise Invalid("invalid_parameter", "top_logprobs needs logprobs: true")
        if body.get("logprobs") not in (None, False, True):
            raise Invalid("invalid_parameter", "logprobs must be true or false")
        if body.get("logprobs"):
            p["logprobs"] = 0 if top is None else top
        schema = _response_format(body.get("response_format"))
        if schema is not None:  # checked as a schema by records.check_param, as a native one
            p["json_schema"] = schema
    elif body.get("logprobs") is not None:
        lp = body["logprobs"]
        if isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= 5:
            raise Invalid("invalid_parameter", "logprobs must be an integer from 0 to 5")
        p["logprobs"] = lp
    if body.get("echo") not in (None, False, True):
        raise Invalid("invalid_parameter", "echo must be true or false")
    return p


def _response_format(fmt: Any) -> Any:
    """The JSON Schema an OpenAI `response_format` asks for, or None for free text."""
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":  # any JSON object
        return {"type": "object"}
    if kind != "json_schema":
        raise Invalid(
            "invalid_parameter",
            'response_format must be {"type": "text"}, {"type": "json_object"} or '
            '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}',
        )
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not NAME.fullmatch(str(spec.get("name", ""))):
        raise Invalid(
            "invalid_parameter",
            "response_format.json_schema needs a name of 1-64 letters, digits, _ or -",
        )
    if not isinstance(spec.get("schema"), dict):
        raise Invalid("invalid_parameter", "response_format.json_schema.schema must be an object")
    return spec["schema"]


def _messages(messages: Any) -> list[dict]:
    """OpenAI messages as native ones: text content parts joined, other parts refused."""
    if not isinstance(messages, list) or not messages:
        raise Invalid("invalid_request", '"messages" must be a non-empty list')
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise Invalid("invalid_request", f'messages[{i}] must be an object with a "role"')
        content = m.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") not in CONTENT_PARTS:
                    raise Invalid(
                        "unsupported_content", f"messages[{i}]: only text content is supported"
                    )
                parts.append(part.get("text"))
            if not all(isinstance(t, str) for t in parts):
                raise Invalid("invalid_request", f"messages[{i}]: a text part needs its text")
            content = "".join(parts)
        if not isinstance(content, str):
            raise Invalid("invalid_request", f"messages[{i}].content must be text")
        out.append({"role": m["role"], "content": content})
    return out


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise Invalid("invalid_request", '"prompt" must be a string (one prompt per request line)')
    return prompt


# --- output lines ------------------------------------------------------------------------------


def output_line(req: Request, result: dict) -> dict:
    """A native result (or error) as the OpenAI batch output line of its request."""
    if "error" in result:
        err = result["error"]
        return error_output(req, err["code"], err["message"])
    chat = req.url == "/v1/chat/completions"
    gens = result.get("generations") or [result]
    choices = [_choice(i, g, chat, req) for i, g in enumerate(gens)]
    body = {
        "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": req.model or "sluice",
        "choices": choices,
        "usage": result["usage"],
    }
    return _line(req, 200, body)


def _choice(index: int, g: dict, chat: bool, req: Request) -> dict:
    finish = FINISH[g["finish_reason"]]
    lps = g.get("logprobs")
    if chat:
        return {
            "index": index,
            "message": {"role": "assistant", "content": g["generated_text"]},
            "logprobs": None if lps is None else {"content": [_chat_lp(t) for t in lps]},
            "finish_reason": finish,
        }
    text = (req.echo or "") + g["generated_text"]
    return {
        "index": index,
        "text": text,
        "logprobs": None if lps is None else _completion_lp(lps, len(req.echo or "")),
        "finish_reason": finish,
    }


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", "replace"))


def _chat_lp(t: dict) -> dict:
    def one(x: dict) -> dict:
        return {"token": x["token"], "logprob": x["logprob"], "bytes": _bytes(x["token"])}

    return {**one(t), "top_logprobs": [one(x) for x in t["top"]]}


def _completion_lp(lps: list[dict], start: int) -> dict:
    offsets, at = [], start
    for t in lps:
        offsets.append(at)
        at += len(t["token"])
    return {
        "tokens": [t["token"] for t in lps],
        "token_logprobs": [t["logprob"] for t in lps],
        "top_logprobs": [{x["token"]: x["logprob"] for x in t["top"]} for t in lps],
        "text_offset": offsets,
    }


def error_output(req: Request, code: str, message: str) -> dict:
    """A failed request's line: an HTTP status and OpenAI's error body, as in its error file."""
    status = SERVER_ERRORS.get(code, 400)
    kind = "server_error" if status >= 500 else "invalid_request_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return _line(req, status, body)


def _line(req: Request, status: int, body: dict) -> dict:
    return {
        "id": "batch_req_" + uuid.uuid4().hex,
        "custom_id": req.custom_id,
        "response": {"status_code": status, "request_id": uuid.uuid4().hex, "body": body},
        "error": None,
    }
