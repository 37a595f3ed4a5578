"""The request parser: any bytes give records or a clear 4xx, and line inputs keep their count."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.records import (
    LINE_TYPES,
    BadRecord,
    BodyError,
    Defaults,
    Record,
    json_safe,
    parse_body,
    split_lines,
)

DEFAULTS = Defaults("generate", {"generate": {"max_new_tokens": 8}})


def expected_lines(body: bytes) -> int:
    return len(list(split_lines(body.removeprefix(b"\xef\xbb\xbf"))))


@settings(max_examples=400, deadline=None)
@given(body=st.binary(max_size=400), ctype=st.sampled_from([*LINE_TYPES, "application/json"]))
def test_any_bytes_never_crash_and_line_inputs_keep_their_count(body, ctype):
    try:
        out = list(parse_body(body, ctype, DEFAULTS))
    except BodyError as e:
        assert e.status in (400, 415) and str(e)
        return
    assert all(isinstance(r, Record | BadRecord) for r in out)
    if ctype in LINE_TYPES:
        assert len(out) == expected_lines(body)
        assert [r.index for r in out] == list(range(len(out)))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=8,
)
record_like = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "text": json_values,
        "inputs": json_values,
        "task": st.sampled_from(["generate", "score", "next_token", "x"]) | json_values,
        "parameters": st.dictionaries(
            st.sampled_from(
                [
                    "max_new_tokens",
                    "temperature",
                    "top_k",
                    "top_p",
                    "seed",
                    "stop",
                    "per_token",
                    "truncation",
                    "bogus",
                ]
            ),
            json_values,
            max_size=3,
        ),
    },
)


@settings(max_examples=400, deadline=None)
@given(records=st.lists(record_like, max_size=6))
def test_structured_records_validate_or_explain(records):
    body = "\n".join(json.dumps(r) for r in records).encode()
    out = list(parse_body(body, "application/jsonlines", DEFAULTS))
    assert len(out) == len(records)
    for given_rec, got in zip(records, out, strict=True):
        if isinstance(got, BadRecord):
            assert got.code and got.message
            if got.code == "invalid_id":  # an id that cannot be written back
                assert not got.has_id
                continue
            if got.code == "invalid_json":  # NaN/Infinity somewhere: a strict-JSON id is echoed
                assert got.has_id == ("id" in given_rec and json_safe(given_rec["id"]))
                continue
        elif got.task == "chat":
            assert got.messages and got.text is None
        else:
            assert got.task in ("generate", "score", "next_token") and got.text.strip()
        assert got.has_id == ("id" in given_rec)


def test_defaults_apply_and_record_parameters_win():
    (rec,) = parse_body(b'{"text": "hi", "parameters": {"seed": 3}}', None, DEFAULTS)
    assert rec.params == {"max_new_tokens": 8, "seed": 3, "do_sample": False}
    (rec,) = parse_body(b'{"text": "hi", "parameters": {"max_new_tokens": 2}}', None, DEFAULTS)
    assert rec.params == {"max_new_tokens": 2, "do_sample": False}


@pytest.mark.parametrize(
    "body, n", [(b"a\nb\n", 2), (b"a\r\nb", 2), (b"", 0), (b"\n", 1), (b"a\n\nb", 3)]
)
def test_split_lines_tolerates_crlf_and_a_trailing_newline(body, n):
    assert expected_lines(body) == n


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ("{}", "must be a JSON Schema (an object)"),
        ({"type": "nope"}, "is not a valid JSON Schema"),
        ({"type": "object", "required": "ok"}, "is not a valid JSON Schema"),
        ({"type": "integer", "minimum": "1"}, "is not a valid JSON Schema"),
        ({"properties": {"a": {"$ref": "https://example.com/s.json"}}}, "refers outside itself"),
    ],
)
def test_a_json_schema_its_metaschema_refuses_is_that_records_error(schema, why):
    body = json.dumps({"id": 1, "text": "hi", "parameters": {"json_schema": schema}}).encode()
    (rec,) = parse_body(body, None, DEFAULTS)
    assert isinstance(rec, BadRecord) and rec.code == "invalid_parameter" and rec.has_id
    assert why in rec.message
