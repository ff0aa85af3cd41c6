"""The one place that turns schema records into JSON-ready data and back, and that
derives the JSON Schema of a :class:`~netprobe.schema.Result` from the classes.
"""

from __future__ import annotations

import json
import math
import operator
import sys
import typing
from functools import cache, lru_cache
from typing import Any, Callable, Optional, TypeVar, Union

import attrs

from netprobe import schema
from netprobe.errors import NetprobeError, ParseError

T = TypeVar("T")

# Hand-written rather than cattrs: cattrs generates (and compiles) a function per class on
# first use in every process, and importing it costs as much again; at a `netprobe run`'s
# start and end that was ~0.1 CPU s, the largest share of a short test's sending end on a
# slow link. The schema has four shapes only (scalars, Optional[X], tuple[X, ...] and attrs
# classes), so one structurer and one unstructurer per type, built once and cached, cover it.


def _finite_float(value: Any) -> float:
    # JSON has no NaN or infinity; Python's reader takes them (and 1e999) anyway, and a
    # figure that is not a number breaks every sum and format downstream.
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


def _strict_int(value: Any) -> int:
    # JSON has one number type: a float (1.9), a boolean (true is 1 to Python) or a string
    # ("2") where a count belongs is a peer's mistake or a probe, never silently rounded.
    if type(value) is not int:
        raise ValueError(f"expected an integer, not {_shown(value)}")
    return value


def _strict_float(value: Any) -> float:
    if type(value) not in (int, float):  # an integer is a number; true and "1.5" are not
        raise ValueError(f"expected a number, not {_shown(value)}")
    return _finite_float(value)


def _strict_str(value: Any) -> str:
    if type(value) is not str:
        raise ValueError(f"expected a string, not {_shown(value)}")
    return value


def _strict_bool(value: Any) -> bool:
    if type(value) is not bool:
        raise ValueError(f"expected true or false, not {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    # A JSON kind and a short cut of the value: what the peer sent is data, never echoed whole.
    text = repr(value)
    return f"a JSON {_json_kind(value)} ({text[:40]}{'...' if len(text) > 40 else ''})"


_SCALAR_STRUCTURE: dict[Any, Callable[[Any], Any]] = {
    int: _strict_int, float: _strict_float, str: _strict_str, bool: _strict_bool}
"""Each scalar type strictly, as JSON carries it: what every record read from a peer, a
saved file or an archive goes through, so one check covers every field."""


class _FieldError(ValueError):
    """A value that does not fit, with the path of the field it was found at."""

    def __init__(self, path: str, cause: BaseException) -> None:
        super().__init__(f"{path}: {_message(cause)}")
        self.path = path
        self.cause = cause


def _message(exc: BaseException) -> str:
    # attrs' validators raise ValueError(message, attribute, ...): the message is args[0].
    args = exc.args
    return args[0] if len(args) > 1 and isinstance(args[0], str) else str(exc)


def unstructure(obj: Any) -> Any:
    """Turn a schema record into plain dicts, lists and scalars (tuples become lists)."""
    return _walk(obj)


def _walk(obj: Any) -> Any:
    # For what the types do not say (an Any field, a dict): look at each value.
    cls: Any = type(obj)
    if attrs.has(cls):
        return _class_unstructurer(cls)(obj)
    if isinstance(obj, (list, tuple)):
        return [_walk(value) for value in obj]
    if isinstance(obj, dict):
        return {key: _walk(value) for key, value in obj.items()}
    return obj


Unstructurer = Optional[Callable[[Any], Any]]
"""How one declared type becomes plain data; None where the value is plain already."""


@cache
def _unstructurer(tp: Any) -> Unstructurer:
    # Built once per type from the declared types, so a record's walk looks at no value it
    # need not (a parse of a long log writes thousands of results).
    if tp in _SCALAR_STRUCTURE:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union and len(args) == 2 and type(None) in args:
        inner = _unstructurer(next(a for a in args if a is not type(None)))
        return None if inner is None else (lambda v: None if v is None else inner(v))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _unstructurer(args[0])
        return list if item is None else (lambda v: [item(x) for x in v])
    if attrs.has(tp):
        return _class_unstructurer(tp)
    return _walk


@cache
def _class_unstructurer(cls: type) -> Callable[[Any], Any]:
    names = _field_names(cls)
    convs: list[Unstructurer] = []
    get = operator.attrgetter(*names) if len(names) > 1 else (lambda o: (getattr(o, names[0]),))

    def build(obj: Any) -> dict[str, Any]:
        if not convs:  # resolved on first use: the schema's classes refer to each other
            hints = _hints(cls)
            convs.extend(_unstructurer(hints[name]) for name in names)
        return {name: value if conv is None else conv(value)
                for name, value, conv in zip(names, get(obj), convs)}

    return build


@cache
def _hints(cls: type) -> dict[str, Any]:
    """The declared type of each of ``cls``'s fields (its bases' included), evaluated.

    What ``typing.get_type_hints`` gives for the schema's classes, for a fraction of its
    cost: it compiles every annotation string anew (~200 compile() calls for the classes of
    one result, a few ms at each process's first JSON), where the schema repeats a few
    dozen strings, each evaluated once per module here (in the module's namespace: the
    class's own names, e.g. a field called ``bytes``, are not types)."""
    hints: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        for name, declared in vars(base).get("__annotations__", {}).items():
            hints[name] = (_evaluated(base.__module__, declared) if isinstance(declared, str)
                           else declared)
    return hints


@cache
def _evaluated(module: str, annotation: str) -> Any:
    # Our own classes' annotations, evaluated as typing.get_type_hints does.
    value = eval(annotation, vars(sys.modules[module]))
    return type(None) if value is None else value


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(a.name for a in attrs.fields(cls))


def structure(data: Any, cls: type[T]) -> T:
    """Build a record of type ``cls`` from plain data; ParseError if it does not fit."""
    try:
        built: T = _structurer(typing.cast(Any, cls))(data)
        return built
    except NetprobeError as exc:
        raise ParseError(str(exc)) from None
    except _FieldError as exc:
        if isinstance(exc.cause, NetprobeError):
            raise ParseError(str(exc.cause)) from None
        raise ParseError(f"not a valid {cls.__name__}: {exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise ParseError(f"not a valid {cls.__name__}: {_message(exc)}") from None


@cache
def _structurer(tp: Any) -> Callable[[Any], Any]:
    if tp is Any:
        return lambda value: value
    if tp in _SCALAR_STRUCTURE:
        return _SCALAR_STRUCTURE[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union and len(args) == 2 and type(None) in args:
        inner = _structurer(next(a for a in args if a is not type(None)))
        return lambda value: None if value is None else inner(value)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _tuple_structurer(_structurer(args[0]))
    if attrs.has(tp):
        return _class_structurer(tp)
    raise TypeError(f"no structure for {tp!r}")


def _tuple_structurer(item: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def build(value: Any) -> tuple[Any, ...]:
        # A string or an object is iterable too: without this, "errors": "boom" would
        # become the errors ("b", "o", "o", "m").
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list, not a JSON {_json_kind(value)}")
        return tuple(_at(f"[{index}]", item, one) for index, one in enumerate(value))

    return build


def _class_structurer(cls: type) -> Callable[[Any], Any]:
    fields: list[tuple[str, str, Callable[[Any], Any]]] = []

    def build(value: Any) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, not a JSON {_json_kind(value)}")
        if not fields:  # resolved on first use: the schema's classes refer to each other
            fields.extend(_fields_of(cls))
        # Unknown keys are ignored: a newer netprobe's result loads in an older one.
        kwargs = {alias: _at(name, convert, value[name])
                  for name, alias, convert in fields if name in value}
        if cls in _NARROWED:
            _refuse_filled(value, _NARROWED[cls]())
        return cls(**kwargs)

    return build


def _stats_left_behind() -> tuple[str, ...]:
    stats = set(_field_names(schema.LatencyStats))
    return tuple(name for name in _field_names(schema.Latency) if name not in stats)


_NARROWED: dict[type, Callable[[], tuple[str, ...]]] = {
    schema.LatencyStats: _stats_left_behind}
"""Records that were once a wider one, and the fields the wider one had: an older result
wrote them there empty (1.11's phase records were whole Latency records), which is left
behind; a filled one is a figure this version has no place for, refused (by its path)
rather than dropped unseen."""


def _refuse_filled(value: dict[str, Any], names: tuple[str, ...]) -> None:
    for name in names:
        if value.get(name) not in (None, [], ()):
            raise _FieldError(name, ValueError(
                f"a figure where this record has none (a run's, not a phase's): "
                f"{_shown(value[name])}"))


def _fields_of(cls: type) -> list[tuple[str, str, Callable[[Any], Any]]]:
    hints = _hints(cls)
    return [(a.name, a.alias or a.name, _structurer(hints[a.name]))
            for a in attrs.fields(cls) if a.init]


def _at(path: str, convert: Callable[[Any], Any], value: Any) -> Any:
    try:
        return convert(value)
    except _FieldError as exc:
        sep = "" if exc.path.startswith("[") else "."
        raise _FieldError(f"{path}{sep}{exc.path}", exc.cause) from None
    except NetprobeError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise _FieldError(path, exc) from None


def _json_kind(value: Any) -> str:
    names = {str: "string", int: "number", float: "number", bool: "boolean", dict: "object",
             list: "array", type(None): "null"}
    return names.get(type(value), type(value).__name__)


NOT_NUMBERS_SHOWN = 5
"""How many of the figures :func:`finite_figures` left out its warning names."""


def finite_figures(result: schema.Result) -> schema.Result:
    """``result`` with every figure that is not a finite number (a tool printed ``nan``,
    ``inf`` or ``1e999``, or a plugin computed one) made unknown (None) and named in a
    warning, so that what was measured still reaches every output (JSON has no NaN);
    ``result`` itself when every figure is finite. ParseError when such a figure is one
    the schema requires."""
    data = unstructure(result)
    found: list[str] = []
    cleaned = _finite(data, "", found)
    if not found:
        return result
    more = len(found) - NOT_NUMBERS_SHOWN
    named = ", ".join(found[:NOT_NUMBERS_SHOWN]) + (f" and {more} more" if more > 0 else "")
    cleaned["warnings"] = [*cleaned.get("warnings", []),
                           f"figures that were not numbers are left out (unknown): {named}"]
    try:
        return structure(cleaned, schema.Result)
    except ParseError:
        raise ParseError(f"figures that are not numbers, where a number is needed: {named}"
                         ) from None


def _finite(value: Any, path: str, found: list[str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        found.append(path)
        return None
    if isinstance(value, dict):
        return {key: _finite(one, f"{path}.{key}" if path else key, found)
                for key, one in value.items()}
    if isinstance(value, list):
        return [_finite(one, f"{path}[{index}]", found) for index, one in enumerate(value)]
    return value


def to_json(result: schema.Result, indent: int | None = 2) -> str:
    """Serialize a result as one JSON document."""
    return json.dumps(unstructure(result), indent=indent, allow_nan=False)


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
    hints = _hints(cls)
    properties: dict[str, Any] = {}
    required = []
    docs = _attribute_docs(cls)
    for attribute in attrs.fields(cls):
        prop = _type_schema(hints[attribute.name], defs)
        choices = _choices(attribute)
        if choices:
            prop = {**prop, "enum": list(choices) + ([None] if "anyOf" in prop else [])}
        if attribute.name in docs:
            prop = {"description": docs[attribute.name], **prop}
        properties[attribute.name] = prop
        if attribute.default is attrs.NOTHING:
            required.append(attribute.name)
    defs[cls.__name__] = {
        "type": "object",
        "description": (cls.__doc__ or "").strip().splitlines()[0],
        "properties": properties,
        "required": required,
    }


def _attribute_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it in the class body, as the schema
    module writes them), for the JSON Schema's descriptions; inherited fields included.
    Read from the source with ast: Python keeps no attribute docstrings at run time."""
    import ast
    import inspect
    import textwrap

    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not attrs.has(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # no source here: no descriptions
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                found[node.target.id] = " ".join(after.value.value.split())
    return found


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
