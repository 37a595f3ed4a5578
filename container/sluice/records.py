"""Request bodies to records and results to response lines: one output line per input line.

Line-based bodies (JSON Lines, plain text, single-column CSV) are split on newlines; a trailing
newline and `\\r\\n` are tolerated. A line that is not valid (bad JSON, wrong types, unknown task or
parameter, empty text, not UTF-8) becomes a `BadRecord` in its place, so its error line keeps the
output aligned with the input. Only a body that cannot be read at all raises `BodyError` (a 4xx).
"""

from __future__ import annotations

import codecs
import csv
import itertools
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from . import openai_batch

TASKS = ("generate", "chat", "score", "next_token")
GENERATING = ("generate", "chat")  # chat: generate over the tokenizer's chat template
SAMPLING = ("temperature", "top_k", "top_p")
BOM = b"\xef\xbb\xbf"
JSONLINES = ("application/jsonlines", "application/x-jsonlines", "application/jsonl")
LINE_TYPES = (*JSONLINES, "text/plain", "text/csv")
JSON = "application/json"
SUPPORTED = (*LINE_TYPES, JSON)

# name -> (type, check, description); every task also takes `truncation`
_INT, _FLOAT, _BOOL = int, float, bool
PARAMETERS: dict[str, dict[str, tuple[type, Any, str]]] = {
    "generate": {
        "max_new_tokens": (_INT, lambda v: 1 <= v <= 4096, "an integer from 1 to 4096"),
        "temperature": (_FLOAT, lambda v: 0 <= v <= 2, "a number from 0 to 2"),  # vLLM refuses more
        "top_k": (_INT, lambda v: v >= 0, "an integer >= 0 (0: off)"),
        "top_p": (_FLOAT, lambda v: 0 < v <= 1, "a number in (0, 1]"),
        "do_sample": (_BOOL, None, "true or false"),
        "seed": (_INT, lambda v: 0 <= v < 2**63, "a non-negative integer"),
        "stop": (list, None, "a string or a list of strings"),
        "num_return_sequences": (_INT, lambda v: 1 <= v <= 16, "an integer from 1 to 16"),
        "repetition_penalty": (_FLOAT, lambda v: 0 < v <= 10, "a number in (0, 10]"),
        "logprobs": (_INT, lambda v: 0 <= v <= 20, "an integer from 0 to 20"),
        # structured output: the answer is JSON valid under this schema (vLLM's guided decoding)
        "json_schema": (dict, None, "a JSON Schema (an object)"),
    },
    "score": {"per_token": (_BOOL, None, "true or false")},
    "next_token": {"top_k": (_INT, lambda v: 1 <= v <= 100, "an integer from 1 to 100")},
}
PARAMETERS["chat"] = PARAMETERS["generate"]
# what a prompt longer than the model allows becomes (docs/container.md "Long inputs"): `left`
# keeps its end, `right` its start, `error` refuses it, `window` (score only) scores it all
TRUNCATION = ("left", "right", "error", "window")
COMMON = {
    "truncation": (
        str,
        lambda v: v in TRUNCATION,
        "'left', 'right', 'error' or 'window' (score only)",
    )
}


class BodyError(Exception):
    """The body cannot be read at all; carries the HTTP status and what to send instead."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Record:
    index: int
    text: str | None
    task: str
    params: dict
    id: Any = None
    has_id: bool = False
    messages: list[dict] | None = None  # chat: [{"role": ..., "content": ...}, ...]
    openai: openai_batch.Request | None = None  # an OpenAI batch line: its output is one too
    adapter: str | None = None  # the named LoRA adapter it runs with (None: the model as served)

    @property
    def generates(self) -> bool:
        return self.task in GENERATING


@dataclass
class BadRecord:
    index: int
    code: str
    message: str
    id: Any = None
    has_id: bool = False
    openai: openai_batch.Request | None = None


@dataclass
class Defaults:
    """Task and parameters a record gets when it names none (sluice.json, then environment)."""

    task: str = "generate"
    params: dict[str, dict] = field(default_factory=dict)
    adapters: tuple[str, ...] = ()  # the named LoRA adapters a record may pick (`adapter`)


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def check_param(task: str, name: str, value: Any) -> Any:
    """`value` as the server takes parameter `name` for `task`; ValueError says why not."""
    spec = PARAMETERS[task].get(name) or COMMON.get(name)
    if spec is None:
        allowed = sorted([*PARAMETERS[task], *COMMON])
        raise ValueError(f"unknown parameter {name!r} for task {task!r}; allowed: {allowed}")
    typ, check, desc = spec
    if name == "stop":
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
            raise ValueError(f"parameter 'stop' must be {desc}")
        return value
    if name == "json_schema":
        return _schema(value, desc)
    ok = isinstance(value, typ) and not (typ is not bool and isinstance(value, bool))
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if ok and typ is float and not math.isfinite(value):
        ok = False
    if not ok or (check is not None and not check(value)):
        raise ValueError(f"parameter {name!r} must be {desc}, got {json.dumps(value)}"[:300])
    return value


def _schema(value: Any, desc: str) -> dict:
    """A JSON Schema its own metaschema accepts (the draft its `$schema` names, else 2020-12)."""
    import jsonschema  # imported here: only records that ask for structured output pay for it

    if not isinstance(value, dict):
        raise ValueError(f"parameter 'json_schema' must be {desc}")
    try:
        jsonschema.validators.validator_for(value).check_schema(value)
    except jsonschema.SchemaError as e:
        msg = f"parameter 'json_schema' is not a valid JSON Schema: {e.message}"
        raise ValueError(msg[:300]) from None
    remote = next(_remote_refs(value), None)
    if remote is not None:  # nothing is fetched while serving: a batch job may have no network
        raise ValueError(f"parameter 'json_schema' refers outside itself ($ref {remote!r})"[:300])
    return value


def _remote_refs(node: Any) -> Iterator[str]:
    """The `$ref`s of a schema that do not point inside it (`#...`)."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            yield ref
        for v in node.values():
            yield from _remote_refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _remote_refs(v)


def make_record(index: int, obj: Any, defaults: Defaults) -> Record | BadRecord:
    """Validate one decoded record (a JSON object, or a bare string from text/csv bodies)."""
    if isinstance(obj, str):
        obj = {"text": obj}
    if not isinstance(obj, dict):
        return BadRecord(index, "invalid_record", "a record must be a JSON object or a string")
    rid, has_id = obj.get("id"), "id" in obj
    if has_id and not json_safe(rid):
        return BadRecord(index, "invalid_id", '"id" cannot be written back as JSON text')

    def bad(code: str, message: str) -> BadRecord:
        return BadRecord(index, code, message, rid, has_id)

    messages = obj.get("messages")
    task = obj.get("task", "chat" if messages is not None else defaults.task)
    if task not in TASKS:
        return bad("unknown_task", f"unknown task {task!r}; choose one of {list(TASKS)}")
    text = obj.get("text", obj.get("inputs"))
    if task == "chat":
        if messages is None and isinstance(text, str) and text.strip():
            messages = [{"role": "user", "content": text}]
        problem = _check_messages(messages)
        if problem:
            return bad("invalid_messages", problem)
        text = None
    elif messages is not None:
        return bad("invalid_record", f'"messages" is for task "chat", not {task!r}')
    elif text is None:
        return bad("missing_text", 'a record needs a "text" (or "inputs") string')
    elif not isinstance(text, str) or not json_safe(text):
        return bad("invalid_text", '"text" must be a string of Unicode characters')
    elif not text.strip():
        return bad("empty_text", '"text" is empty')
    adapter = obj.get("adapter")
    if adapter is not None and not isinstance(adapter, str):
        return bad("invalid_record", '"adapter" must be a string: the name of one of the adapters')
    if adapter is not None and adapter not in defaults.adapters:
        there = ", ".join(defaults.adapters) or "none"
        return bad("unknown_adapter", f"no adapter {adapter!r} in this model (adapters: {there})")
    params = obj.get("parameters", {})
    if not isinstance(params, dict):
        return bad("invalid_parameters", '"parameters" must be a JSON object')
    merged = dict(defaults.params.get("generate" if task == "chat" else task, {}))
    try:
        for name, value in params.items():
            merged[name] = check_param(task, name, value)
    except ValueError as e:
        return bad("invalid_parameter", str(e))
    if task in GENERATING:
        # sampling is on when asked, or when the record sets a sampling knob; else the defaults'
        if "do_sample" not in params and any(k in params for k in SAMPLING):
            merged["do_sample"] = True
        merged.setdefault("do_sample", any(k in merged for k in SAMPLING))
        greedy = not merged["do_sample"] or merged.get("temperature", 1.0) == 0
        if merged.get("num_return_sequences", 1) > 1 and greedy:  # vLLM refuses it
            return bad(
                "invalid_parameter",
                "several generations need sampling: set temperature > 0 (or do_sample true)",
            )
    return Record(index, text, task, merged, rid, has_id, messages, adapter=adapter)


def _check_messages(messages: Any) -> str | None:
    """What is wrong with a chat conversation, or None."""
    if not isinstance(messages, list) or not messages:
        return 'a chat record needs "messages": a non-empty list of {"role", "content"} objects'
    for i, m in enumerate(messages):
        if not (
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            and json_safe(m)
        ):
            return f'messages[{i}] must be an object with string "role" and "content"'
    return None


def json_safe(value: Any) -> bool:
    """Can this value be written back as strict JSON in UTF-8 (no NaN, no lone surrogates)?"""
    try:
        dumps(value).encode("utf-8")
    except (ValueError, TypeError, UnicodeEncodeError, RecursionError):
        return False
    return True


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (send null or a string)")


def loads(text: str | bytes) -> Any:
    """Strict JSON: NaN/Infinity refused (Python's json takes them; AWS and our output do not)."""
    return json.loads(text, parse_constant=_no_constant)


def _decode_json_line(index: int, line: str, defaults: Defaults) -> Record | BadRecord:
    try:
        obj = loads(line)
    except json.JSONDecodeError as e:
        return BadRecord(index, "invalid_json", f"not valid JSON: {e.msg}")
    except (ValueError, RecursionError) as e:
        bad = BadRecord(index, "invalid_json", f"not valid JSON: {e}"[:200])
        _echo_id(bad, line)
        return bad
    return decode_record(index, obj, defaults)


def decode_record(index: int, obj: Any, defaults: Defaults) -> Record | BadRecord:
    """A decoded JSON value as a record: a native one, or an OpenAI batch request line."""
    if not openai_batch.is_request(obj):
        return make_record(index, obj, defaults)
    req = openai_batch.request_of(obj)
    try:
        task, fields = openai_batch.to_native(obj)
    except openai_batch.Invalid as e:
        return BadRecord(index, e.code, str(e), openai=req)
    body = obj["body"]
    if body.get("temperature") is None:  # OpenAI's default is 1; vLLM's the model's, else 1
        t = defaults.params.get("generate", {}).get("temperature", 1.0)
        fields["parameters"].update(temperature=t, do_sample=t > 0)
    if body.get("model") in defaults.adapters:  # `model` names an adapter: its records use it
        fields["adapter"] = body["model"]
    rec = make_record(index, {"task": task, **fields}, defaults)
    rec.openai = req
    if isinstance(rec, BadRecord):
        return rec
    p = rec.params
    if task == "chat" and body.get("max_tokens", body.get("max_completion_tokens")) is None:
        p["max_new_tokens"] = None  # up to the model's context, as OpenAI and vLLM do
    if body.get("echo"):
        req.echo = rec.text
    return rec


def _echo_id(bad: BadRecord, line: str) -> None:
    """A line that is an object but not strict JSON (NaN, Infinity) still has an id to echo."""
    try:
        obj = json.loads(line)  # Python's json takes the constants strict JSON refuses
    except (ValueError, RecursionError):
        return
    if isinstance(obj, dict) and "id" in obj and json_safe(obj["id"]):
        bad.id, bad.has_id = obj["id"], True
    if openai_batch.is_request(obj):
        bad.openai = openai_batch.request_of(obj)


def _csv_field(line: str) -> str:
    row = next(csv.reader([line]))
    if len(row) != 1:
        raise ValueError(
            f"text/csv takes one column, this line has {len(row)}; "
            "send application/jsonlines for records with several fields"
        )
    return row[0]


def split_lines(body: bytes) -> Iterator[bytes]:
    """Lines of a body without their terminators; a final newline does not start a record."""
    start, n = 0, len(body)
    while start < n:
        end = body.find(b"\n", start)
        if end == -1:
            end = n
        line = body[start:end]
        yield line[:-1] if line.endswith(b"\r") else line
        start = end + 1


def parse_body(body: bytes, content_type: str | None, defaults: Defaults) -> Iterator:
    """Records and BadRecords in input order, lazily for line-based bodies.

    Raises BodyError at once (before any output is sent) for a body that cannot be read.
    """
    if body.startswith(BOM):  # some editors and Windows tools write one; it is not part of the text
        body = body[len(BOM) :]
    kind = check_readable(body, content_type)
    if kind == JSON:
        return iter(list(_parse_json(body, defaults)))
    return _parse_lines(split_lines(body), kind, defaults)


def parse_stream(chunks: Iterable[bytes], content_type: str | None, defaults: Defaults) -> Iterator:
    """Records of a body that is still arriving (chunked, no size limit), line by line.

    The first chunk is checked before anything is answered (BodyError); a JSON document is read
    whole first. Lines are answered as they complete.
    """
    chunks = iter(chunks)
    first = next(chunks, b"")
    if first.startswith(BOM):
        first = first[len(BOM) :]
    kind = media_type(content_type) or "application/jsonlines"
    if kind == JSON:
        return parse_body(first + b"".join(chunks), content_type, defaults)
    check_readable(first[:4], content_type)
    return _parse_lines(stream_lines(itertools.chain([first], chunks)), kind, defaults)


def stream_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """`split_lines` over a body arriving in chunks."""
    rest = b""
    for chunk in chunks:
        rest += chunk
        *lines, rest = rest.split(b"\n")
        for line in lines:
            yield line[:-1] if line.endswith(b"\r") else line
    if rest:
        yield rest[:-1] if rest.endswith(b"\r") else rest


def _parse_lines(
    lines: Iterable[bytes], kind: str, defaults: Defaults
) -> Iterator[Record | BadRecord]:
    openai = False  # once a body has OpenAI request lines, its unreadable lines answer as such
    for index, raw in enumerate(lines):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            bad = BadRecord(index, "invalid_utf8", f"not UTF-8 (byte {e.start} of the line)")
            if openai:
                bad.openai = openai_batch.Request()
            yield bad
            continue
        if kind in JSONLINES:
            rec = _decode_json_line(index, line, defaults)
            if rec.openai is not None:
                openai = True
            elif openai and isinstance(rec, BadRecord) and not rec.has_id:
                rec.openai = openai_batch.Request()  # a native line with an id keeps its shape
            yield rec
        elif kind == "text/csv":
            try:
                yield make_record(index, _csv_field(line), defaults)
            except (ValueError, csv.Error) as e:
                yield BadRecord(index, "invalid_csv", str(e))
        else:
            yield make_record(index, line, defaults)


def check_readable(body: bytes, content_type: str | None) -> str:
    """Refuse, before any output is sent, a body that cannot be read at all; return its type.

    A line-based body with some bad lines is readable (those lines get error lines); one in which
    no line is UTF-8 (UTF-16, binary) is not.
    """
    kind = media_type(content_type) or "application/jsonlines"
    if kind not in SUPPORTED:
        raise BodyError(
            415,
            f"unsupported content type {kind!r}: send application/jsonlines (one JSON object a "
            "line), application/json, text/plain or text/csv (one prompt a line)",
        )
    if kind in LINE_TYPES:
        if body.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise BodyError(400, "the body is UTF-16; send UTF-8 text")
        if not is_utf8(body) and not any(_decodes(line) for line in split_lines(body)):
            raise BodyError(400, "no line of the body is UTF-8 text; send UTF-8")
    return kind


def is_utf8(body: bytes, chunk: int = 1 << 20) -> bool:
    """Validate UTF-8 a chunk at a time: a decoded copy of a 100 MB body would double its cost."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(body)
    try:
        for start in range(0, len(body), chunk):
            decoder.decode(view[start : start + chunk])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def _decodes(line: bytes) -> bool:
    try:
        line.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _parse_json(body: bytes, defaults: Defaults):
    try:
        doc = loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise BodyError(400, "the body is not UTF-8; send UTF-8 JSON") from None
    except json.JSONDecodeError as e:
        extra = "Extra data" in e.msg
        hint = " (one JSON object a line? send application/jsonlines)" if extra else ""
        raise BodyError(400, f"the body is not one JSON document: {e.msg}{hint}") from None
    except (ValueError, RecursionError) as e:
        raise BodyError(400, f"the body is not one JSON document: {e}"[:300]) from None
    items = doc if isinstance(doc, list) else [doc]
    for index, obj in enumerate(items):
        yield decode_record(index, obj, defaults)


def error_line(rec: BadRecord) -> dict:
    out: dict = {"id": rec.id} if rec.has_id else {}
    out["error"] = {"code": rec.code, "message": rec.message}
    return out


def dumps(obj: dict) -> str:
    """One compact JSON line (no pretty printing, no raw newlines: strings are escaped)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
