"""Deep size of an object graph: what a supervisor holds, for its bytes per step."""

from __future__ import annotations

import gc
import sys
import threading
import types
from typing import Any

# Shared or fixed things a supervisor refers to but does not own: never counted.
_SKIP = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
         types.CodeType, types.FrameType, threading.Thread, type(threading.Lock()), threading.Event,
         threading.Condition)


def deep_size(root: Any, exclude: tuple[type, ...] = ()) -> int:
    """Bytes of `root` and everything it reaches, each object once, leaving out `exclude`d types."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    skip = _SKIP + exclude
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total
