"""A bound on how deeply a JSON request body nests, checked on the raw bytes before any route decodes it.

Python's JSON decoder recurses once per `[`/`{`: a body nested a few thousand levels deep
raises RecursionError inside it (a 500). So this plain ASGI middleware reads the body (already
bounded in size and read time by api/http/limits.py, outside it), counts the nesting outside
strings, answers 422 past `MAX_JSON_DEPTH`, and hands the same bytes on. Every route that reads
JSON is covered: the spec bodies (api/http/spec_body.py) and those FastAPI decodes itself.

The scan is linear and runs in C (regular expressions, `translate`, `accumulate`): strings are
removed first (escapes honoured, so `"\\"[["` counts nothing), then the brackets' running sum.
"""

from __future__ import annotations

import json
import re
from array import array
from itertools import accumulate

from api.http.errors import error_response

# Far above any real spec (the deepest in examples/ and tests/ nests 4 levels), far below
# where the decoder recurses out (about 1,000).
MAX_JSON_DEPTH = 64

# A string, its escapes taken whole; possessive, and an unterminated one runs to the end,
# so that no input makes the search backtrack.
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_STEP = str.maketrans({"[": "\x01", "{": "\x01", "]": "\xff", "}": "\xff"})  # +1 / -1 as signed bytes


def nesting_depth(body: bytes) -> int:
    """The deepest `[`/`{` nesting of a JSON text outside its strings; 0 for a scalar or for bytes
    that are not text in one of JSON's encodings (the decoder then reports them malformed)."""
    try:
        text = body.decode(json.detect_encoding(body))
    except UnicodeDecodeError:
        return 0
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    steps = array("b", brackets.translate(_STEP).encode("latin-1"))
    return max(accumulate(steps, initial=0))


def too_deep_message(depth: int, limit: int = MAX_JSON_DEPTH) -> str:
    return f"body: JSON nested {depth} levels deep, deeper than {limit} levels (the limit)"


async def read_body(receive) -> tuple[bytes | None, dict]:
    """The whole body, or None and the message that ended it early (the client left)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None, message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), message


class JsonDepthMiddleware:
    """`skip`: exact paths whose body is a file, not JSON (a code upload)."""

    def __init__(self, app, max_depth: int = MAX_JSON_DEPTH, skip: frozenset[str] = frozenset()):
        self.app, self.max_depth, self.skip = app, max_depth, skip

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in self.skip:
            return await self.app(scope, receive, send)
        body, last = await read_body(receive)
        # Counting brackets is a memchr: a body with few of them (a spec has about ten) needs no scan.
        if body is not None and body.count(b"[") + body.count(b"{") > self.max_depth:
            if (depth := nesting_depth(body)) > self.max_depth:
                msg = too_deep_message(depth, self.max_depth)
                # The body was read whole, so the connection stays usable: no Connection: close.
                return await error_response(422, msg, [{"field": "body", "message": msg}])(scope, receive, send)
        pending = [last if body is None else {"type": "http.request", "body": body, "more_body": False}]

        async def replay():
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)
