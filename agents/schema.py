"""JSON schemas of tool arguments, made from the API's signatures: a parameter's annotation gives
its type (an enum its allowed values), its default makes it optional. Only the simple types the
commands take are described; `tools` names the rest by hand."""

from __future__ import annotations

import enum
import inspect
import sys
import types
import typing
from pathlib import Path
from typing import Any

_SIMPLE = {int: "integer", float: "number", bool: "boolean", str: "string", Path: "string"}


def _schema_of(annotation: Any) -> dict[str, Any] | None:
    """The JSON schema of one annotation, or None where it is none of the simple types."""
    if annotation in _SIMPLE:
        return {"type": _SIMPLE[annotation]}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"type": "string", "enum": [str(m.value) for m in annotation]}
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        # `X | str` (an enum or its name) and `X | None`: the first describable member that is
        # not None, an enum preferred to a plain string
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        described = [s for s in (_schema_of(a) for a in members) if s is not None]
        enums = [s for s in described if "enum" in s]
        if enums:
            return enums[0]
        return described[0] if described else None
    if origin is list:
        item = _schema_of(typing.get_args(annotation)[0]) if typing.get_args(annotation) else None
        return {"type": "array", "items": item or {}}
    return None


def _parameter_hints(function: Any) -> dict[str, Any]:
    """Each parameter's annotation, evaluated (the API writes them as strings); one that names a
    type only imported for type checking is left out, and so is its parameter."""
    module = sys.modules.get(function.__module__)
    namespace = dict(vars(module)) if module else {}
    hints = {}
    for name, annotation in getattr(function, "__annotations__", {}).items():
        if name == "return":
            continue
        try:
            hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation
        except (NameError, AttributeError, SyntaxError):
            hints[name] = None
    return hints


def parameters_schema(function: Any, *, skip: tuple[str, ...] = (), extra: dict[str, dict[str, Any]] | None = None,
                      descriptions: dict[str, str] | None = None) -> dict[str, Any]:
    """An object schema of `function`'s parameters (self, `skip` and callables left out), each
    parameter's type from its annotation; parameters without a default are required. `extra`
    adds properties (name -> schema) required unless their schema says "default"."""
    hints = _parameter_hints(function)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, parameter in inspect.signature(function).parameters.items():
        if name in ("self", *skip) or parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
            continue
        schema = _schema_of(hints.get(name, str)) if hints.get(name, str) is not None else None
        if schema is None:
            continue
        if parameter.default is inspect.Parameter.empty:
            required.append(name)
        elif parameter.default is None:  # optional: null means "the default"
            schema["type"] = [schema["type"], "null"]
        else:
            default = parameter.default
            schema["default"] = default.value if isinstance(default, enum.Enum) else default
        if descriptions and name in descriptions:
            schema["description"] = descriptions[name]
        properties[name] = schema
    for name, schema in (extra or {}).items():
        properties[name] = schema
        if "default" not in schema and name not in required:
            required.append(name)
        elif "default" in schema and name in required:
            required.remove(name)
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
