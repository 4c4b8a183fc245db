"""The JSON response of the hot routes: orjson renders a job several times faster than the stdlib,
and writes non-finite floats as null (the stdlib writes NaN, which is not JSON)."""

from __future__ import annotations

import orjson
from fastapi.responses import JSONResponse


class FastJSONResponse(JSONResponse):
    def render(self, content) -> bytes:
        return orjson.dumps(content)
