"""Text to token ids: UTF-8 bytes (vocabulary 256) or a local Hugging Face tokenizer directory."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


def encode(text_or_ids: Any, tokenizer: str | None) -> list[int]:
    """Token ids of a record's value: a string is tokenised, a list of ints is taken as ids."""
    if isinstance(text_or_ids, str):
        if tokenizer is None:
            return list(text_or_ids.encode("utf-8"))
        return list(_hf_tokenizer(tokenizer)(text_or_ids)["input_ids"])
    if isinstance(text_or_ids, (list, tuple)) and all(isinstance(t, int) for t in text_or_ids):
        return list(text_or_ids)
    raise TypeError(f"expected a string or a list of token ids, got {type(text_or_ids).__name__}")


@lru_cache(maxsize=2)
def _hf_tokenizer(directory: str) -> Any:
    from transformers import AutoTokenizer  # the optional extra trainyard[hf]

    return AutoTokenizer.from_pretrained(directory, local_files_only=True)
