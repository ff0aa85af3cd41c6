"""The base of netprobe's attrs records: ``repr``, ``==`` and ``hash`` written once.

attrs writes these three methods as Python source for every class and compiles it when the
class is made, at import. For the schema's classes that compile() was half of the module's
import time (~8 of ~16 ms here), paid again by every process: on a slow link a short
``netprobe run`` spends more CPU starting than sending. A class made with
``@attrs.frozen(repr=False, eq=False)`` (or ``define``) that derives from :class:`Record`
gets the same behaviour from the three methods below, which read the class's attrs fields:

- ``repr``: ``Name(field=value, ...)`` over the fields with ``repr=True`` (a field's own
  repr callable used where it has one); a record met again inside itself is ``...``.
- ``==``: records of the very same class, field by field (``eq=True`` fields, through their
  ``eq_key`` where set); anything else is ``NotImplemented``, as attrs does.
- ``hash``: from the class and the hashed fields' values (through their ``eq_key`` too),
  so equal records hash alike.

Only :mod:`netprobe.errors`-level code may import this module (it imports nothing of ours):
:mod:`netprobe.schema` and the data path's records build on it.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

_repr_context = threading.local()


class _Shape:
    """What the three methods need of one class, read once from its attrs fields."""

    __slots__ = ("compared", "hashed", "reprs")

    def __init__(self, cls: type) -> None:
        fields = cls.__attrs_attrs__  # type: ignore[attr-defined]
        self.reprs: tuple[tuple[str, Callable[[Any], str]], ...] = tuple(
            (a.name, a.repr if callable(a.repr) else repr) for a in fields if a.repr)
        self.compared: tuple[tuple[str, Any], ...] = tuple(
            (a.name, a.eq_key) for a in fields if a.eq)
        self.hashed: tuple[tuple[str, Any], ...] = tuple(
            (a.name, a.eq_key) for a in fields if a.hash is True or (a.hash is None and a.eq))


_SHAPES: dict[type, _Shape] = {}


def _shape_of(record: object) -> _Shape:
    cls = record.__class__
    shape = _SHAPES.get(cls)
    if shape is None:  # two threads may both build it: the same shape either way
        shape = _SHAPES[cls] = _Shape(cls)
    return shape


class Record:
    """Base of an attrs class made with ``repr=False, eq=False``: see the module docstring."""

    __slots__ = ()

    def __repr__(self) -> str:
        seen: set[int] | None = getattr(_repr_context, "seen", None)
        if seen is None:
            seen = _repr_context.seen = set()
        if id(self) in seen:
            return "..."
        seen.add(id(self))
        try:
            parts = ", ".join(f"{name}={show(getattr(self, name))}"
                              for name, show in _shape_of(self).reprs)
        finally:
            seen.discard(id(self))
        return f"{self.__class__.__qualname__.rsplit('>.', 1)[-1]}({parts})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        for name, key in _shape_of(self).compared:
            mine, theirs = getattr(self, name), getattr(other, name)
            if key is not None:
                mine, theirs = key(mine), key(theirs)
            if not mine == theirs:
                return False
        return True

    def __hash__(self) -> int:
        # As attrs: the values through their eq key where a field has one.
        return hash((self.__class__, *(getattr(self, name) if key is None
                                       else key(getattr(self, name))
                                       for name, key in _shape_of(self).hashed)))
