"""A DCP `.metadata` file read without torch: which shard files it names, and how far into each.

The file is a pickle of torch's Metadata; unpickling it as such imports torch (~250 MiB, seconds),
which the supervisor does each time it looks for the latest complete checkpoint. Here every
torch class in the pickle is rebuilt as a plain stand-in holding the same fields, which is all
that completeness (layout.missing_files) reads: storage_data's relative_path, offset and length.
A pickle naming anything else (a DCP version this reader does not know) is unpickled as before,
torch and all: a complete checkpoint must never read as incomplete.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

_SAFE_BUILTINS = {("builtins", n) for n in ("dict", "list", "tuple", "set", "frozenset", "int", "float", "str",
                                            "bytes", "bool", "slice", "complex", "bytearray", "object")}
_SAFE_BUILTINS |= {("collections", "OrderedDict"), ("copyreg", "_reconstructor"), ("copyreg", "__newobj__"),
                   ("_codecs", "encode")}
_SAFE_BUILTINS |= {("pathlib", n) for n in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")}


class TorchStandIn:
    """One of torch's classes (or enums, dtypes, functions) as seen in a pickle: its fields, nothing more."""

    def __new__(cls, *args: Any, **kwargs: Any) -> TorchStandIn:
        obj = super().__new__(cls)
        obj.__dict__["args"] = args
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots) of a slotted dataclass
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["state"] = state

    def __getattr__(self, name: str) -> Any:  # a field the pickle did not carry
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")


class _NotTorchOnly(Exception):
    """The pickle names a class that is neither torch's nor a plain builtin."""


class _TorchFreeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" or module.startswith("torch."):
            return type(name, (TorchStandIn,), {"__module__": module})
        if (module, name) in _SAFE_BUILTINS:
            return super().find_class(module, name)
        raise _NotTorchOnly(f"{module}.{name}")


def read_metadata(raw: bytes) -> Any:
    """The metadata object (stand-ins for torch's classes); raises on a truncated or foreign file."""
    try:
        return _TorchFreeUnpickler(io.BytesIO(raw)).load()
    except _NotTorchOnly:
        return pickle.loads(raw)
