"""The public surface of a `nixl_connect`-like module, as plain data: every
public class and function the module defines, each class's public members
(what kind each is: property, method, coroutine, classmethod, ...), every
callable's signature (parameter names, kinds and defaults, via
`inspect.signature`), enum members and values, and pydantic fields with
their defaults.

Used by test_api_surface.py on this package (in process) and on Dynamo
1.6.1's real module (``python surface.py dynamo.nixl_connect`` in a child
process with Dynamo's source on its path: it prints the JSON).

What is left out is what the two modules get from the same libraries:
members inherited from (or overriding) pydantic's `BaseModel`, `enum`,
`int`, `abc.ABC` and `object`, but for ``__init__``, ``__enter__`` and
``__exit__``. Annotations are not compared (the two spell the same types
differently: ``Optional[str]`` and ``str | None``).
"""

from __future__ import annotations

import enum
import functools
import importlib
import inspect
import json
import sys
from typing import Any

# Dunders that are part of the surface a caller uses.
DUNDERS = ("__init__", "__enter__", "__exit__")


def _library_bases() -> tuple[type, ...]:
    bases: list[type] = [object, int, enum.Enum, enum.IntEnum]
    try:
        import abc

        bases.append(abc.ABC)
    except ImportError:
        pass
    try:
        from pydantic import BaseModel

        bases.append(BaseModel)
    except ImportError:
        pass
    return tuple(bases)


LIBRARY_BASES = _library_bases()


def signature(obj: Any) -> list[list[Any]] | None:
    """``[name, kind, default-or-None]`` per parameter; None if it has none."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        out.append([p.name, p.kind.name, default])
    return out


def _kind(static: Any) -> str:
    if isinstance(static, property):
        return "property"
    if isinstance(static, functools.cached_property):
        return "cached_property"
    if isinstance(static, classmethod):
        return "classmethod"
    if isinstance(static, staticmethod):
        return "staticmethod"
    if inspect.iscoroutinefunction(static):
        return "coroutine"
    if inspect.isfunction(static):
        return "method"
    return "attribute"


def _from_library(cls: type, name: str) -> bool:
    """Whether `name` is one of the library bases' members (inherited or
    overridden); a dunder of `DUNDERS` only if a library base defines the one
    `cls` has."""
    if name in DUNDERS:
        owner = next((k for k in cls.__mro__ if name in vars(k)), object)
        return owner in LIBRARY_BASES or owner.__module__ in ("builtins", "enum", "abc")
    return any(base in cls.__mro__ and name in dir(base) for base in LIBRARY_BASES)


def describe_class(cls: type) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "kind": "class",
        "bases": [b.__name__ for b in cls.__bases__],
        "members": {},
    }
    if issubclass(cls, enum.Enum):
        entry["enum"] = {m.name: m.value for m in cls}
    fields = getattr(cls, "model_fields", None)
    if isinstance(fields, dict):
        entry["fields"] = {n: repr(f.default) for n, f in fields.items()}
    members = entry["members"]
    for name in sorted(set(dir(cls))):
        if name.startswith("_") and name not in DUNDERS:
            continue
        if "enum" in entry and name in entry["enum"]:
            continue
        if _from_library(cls, name):
            continue
        static = inspect.getattr_static(cls, name)
        kind = _kind(static)
        member: dict[str, Any] = {"kind": kind}
        if kind in ("method", "coroutine", "classmethod", "staticmethod"):
            member["signature"] = signature(getattr(cls, name))
        members[name] = member
    return entry


def surface(module: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isclass(obj):
            out[name] = describe_class(obj)
        elif inspect.isfunction(obj):
            out[name] = {"kind": "function", "signature": signature(obj)}
    return out


if __name__ == "__main__":
    print(json.dumps(surface(importlib.import_module(sys.argv[1]))))
