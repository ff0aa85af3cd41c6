"""The one place that turns schema records into JSON-ready data and back, and that
derives the JSON Schema of a :class:`~netprobe.schema.Result` from the classes.
"""

from __future__ import annotations

import json
import math
import sys
import typing
from functools import lru_cache
from typing import Any, TypeVar, Union

import attrs
import cattrs

from netprobe import schema
from netprobe.errors import NetprobeError, ParseError

T = TypeVar("T")

_converter = cattrs.Converter(forbid_extra_keys=False)


def _finite_float(value: Any, _: Any) -> float:
    # JSON has no NaN or infinity; Python's reader takes them (and 1e999) anyway, and a
    # figure that is not a number breaks every sum and format downstream.
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


def _is_tuple(tp: Any) -> bool:
    return typing.get_origin(tp) is tuple


def _tuple_hook(tp: Any) -> Any:
    def hook(value: Any, _: Any) -> Any:
        # A string or an object is iterable too: without this, "errors": "boom" would
        # become the errors ("b", "o", "o", "m").
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list, not a JSON {type(value).__name__}")
        return _converter._structure_tuple(value, tp)

    return hook


_converter.register_structure_hook(float, _finite_float)
_converter.register_structure_hook_factory(_is_tuple, _tuple_hook)


def unstructure(obj: Any) -> Any:
    """Turn a schema record into plain dicts, lists and scalars (tuples become lists)."""
    return _lists(_converter.unstructure(obj))


def _lists(data: Any) -> Any:
    if isinstance(data, dict):
        return {key: _lists(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_lists(value) for value in data]
    return data


def structure(data: Any, cls: type[T]) -> T:
    """Build a record of type ``cls`` from plain data; ParseError if it does not fit."""
    try:
        return _converter.structure(data, cls)
    except NetprobeError as exc:
        raise ParseError(str(exc)) from None
    except (cattrs.BaseValidationError, TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ParseError(f"not a valid {cls.__name__}: {_first_error(exc)}") from None


def _first_error(exc: BaseException) -> str:
    while isinstance(exc, cattrs.BaseValidationError) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


def to_json(result: schema.Result, indent: int | None = 2) -> str:
    """Serialize a result as one JSON document."""
    # json writes tuples as arrays itself: the walk that turns them into lists (unstructure)
    # would cost more than the encoding on a parse of many tests.
    return json.dumps(_converter.unstructure(result), indent=indent, allow_nan=False)


def from_json(text: str, source: str | None = None) -> schema.Result:
    """Load a result from one JSON document."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise ParseError(f"not JSON: {exc}", source) from None
    try:
        return structure(data, schema.Result)
    except ParseError as exc:
        raise ParseError(exc.detail, source) from None


# --- JSON Schema generation ------------------------------------------------------------

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type_schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Union:
        members = [_type_schema(a, defs) for a in args if a is not type(None)]
        nullable = type(None) in args
        one = members[0] if len(members) == 1 else {"anyOf": members}
        return {"anyOf": [one, {"type": "null"}]} if nullable else one
    if origin in (tuple, list):
        return {"type": "array", "items": _type_schema(args[0], defs)}
    if tp is float:
        return {"type": "number"}
    if tp in _SCALARS:
        return {"type": _SCALARS[tp]}
    if attrs.has(tp):
        _define(tp, defs)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    raise TypeError(f"no JSON Schema mapping for {tp!r}")


def _define(cls: type, defs: dict[str, Any]) -> None:
    if cls.__name__ in defs:
        return
    defs[cls.__name__] = {}  # placeholder against recursion
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    properties: dict[str, Any] = {}
    required = []
    for attribute in attrs.fields(cls):
        prop = _type_schema(hints[attribute.name], defs)
        choices = _choices(attribute)
        if choices:
            prop = {**prop, "enum": list(choices) + ([None] if "anyOf" in prop else [])}
        properties[attribute.name] = prop
        if attribute.default is attrs.NOTHING:
            required.append(attribute.name)
    defs[cls.__name__] = {
        "type": "object",
        "description": (cls.__doc__ or "").strip().splitlines()[0],
        "properties": properties,
        "required": required,
    }


def _choices(attribute: attrs.Attribute) -> tuple[Any, ...] | None:
    validator = attribute.validator
    inner = getattr(validator, "validator", validator)  # optional(in_(...))
    options = getattr(inner, "options", None)
    return tuple(options) if options else None


@lru_cache(maxsize=1)
def result_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a Result, derived from the attrs classes."""
    defs: dict[str, Any] = {}
    _define(schema.Result, defs)
    root = defs.pop("Result")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:netprobe:result:{schema.SCHEMA_VERSION}",
        "title": "netprobe Result",
        **root,
        "$defs": defs,
    }


def schema_text() -> str:
    """The shipped JSON Schema file's exact text (``result.schema.json`` in the package)."""
    return json.dumps(result_json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # python -m netprobe.convert > netprobe/result.schema.json
    sys.stdout.write(schema_text())
