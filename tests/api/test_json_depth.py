"""The nesting scan of api/http/json_depth.py on raw bodies: brackets count outside strings only."""

from __future__ import annotations

import json

import pytest

from api.http.json_depth import MAX_JSON_DEPTH, nesting_depth


@pytest.mark.parametrize("body,depth", [
    (b"", 0), (b"3", 0), (b'"text"', 0), (b"{}", 1), (b"[[], {}]", 2),
    (b'{"a": [1, {"b": []}], "c": {}}', 4),
    (b'{"a": "[[[{{{"}', 1),  # brackets inside a string are text
    (b'{"a": "\\"[[["}', 1),  # an escaped quote does not end the string
    (b'{"a": "\\\\"}[[', 2),  # an escaped backslash does: the brackets after it count
    (b'{"a": "\\u005b[["}', 1),
    (b'{"a": "[[[', 1),  # unterminated: the rest is string (the decoder then reports it malformed)
    (b"]][", 0),  # malformed from its first byte: the decoder stops there, before any recursion
    (b"\xff\xfe\xfd", 0),  # not text: the decoder names the body
])
def test_nesting_depth(body, depth):
    assert nesting_depth(body) == depth


def test_every_json_encoding_and_the_limit_is_above_any_spec():
    deep = "[" * 100 + "]" * 100
    for encoding in ("utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32"):
        assert nesting_depth(deep.encode(encoding)) == 100, encoding
    spec = {"model": {"hf": {"model_type": "llama", "config": {"rope_scaling": {"factor": [1.0]}}}}}
    assert nesting_depth(json.dumps(spec).encode()) == 6 < MAX_JSON_DEPTH


def test_a_huge_adversarial_body_is_scanned_without_backtracking():
    # An unterminated string full of escaped quotes: a backtracking string pattern restarts at
    # every quote (quadratic: 40 s for 60 kB already); this one takes the rest of the body as the string.
    assert nesting_depth(b'{"a": "' + b'\\"[' * 300_000) == 1
    assert nesting_depth(b"[" * 1_000_000) == 1_000_000
