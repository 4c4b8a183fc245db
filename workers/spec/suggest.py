"""'did you mean ...?': the closest of the valid words to one a user mistyped (a spec key, an HF model
type or config field)."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable


def did_you_mean(word: str, choices: Iterable[str], *, n: int = 3, show: Callable[[str], str] = repr) -> str:
    """'; did you mean 'a', 'b'?' for the choices close to `word` (best first), or '' when none is."""
    close = difflib.get_close_matches(word, list(choices), n=n)
    return f"; did you mean {', '.join(map(show, close))}?" if close else ""
