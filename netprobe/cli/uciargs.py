"""``netprobe server --uci FILE``: a UCI file's ``config server`` section as server options.

Each option of the section is the server option of the same name, ``_`` for ``-``
(``option max_duration '60'`` is ``--max-duration 60``, ``list allow '10.0.0.0/8'`` one
``--allow``, ``option iperf3 '1'`` the flag ``--iperf3``), converted by the option's own
argparse type and checked by the same code that checks the command line (``check``), so a
value the command line refuses is refused here too, naming the file and line. What the
command line sets wins; an option it leaves at its default takes the file's value. The
names come from the parser itself: an option added to the server is a UCI option as well.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from netprobe.cli.exitcodes import UsageError
from netprobe.errors import NetprobeError, ParseError

SECTION = "server"
"""The section type read (``config server``); any other type is refused as a typo."""

_NOT_UCI = ("help", "uci")  # dests that no file may set
_TRUE = ("1", "yes", "on", "true", "enabled")  # OpenWrt's boolean spellings
_FALSE = ("0", "no", "off", "false", "disabled")


def apply_uci(args: argparse.Namespace, actions: Sequence[argparse.Action],
              check: Callable[[argparse.Namespace], Any]) -> None:
    """Set ``args`` from the UCI file ``args.uci`` where the command line did not; ParseError
    (file:line) for anything the file says wrong, UsageError if it says ``enabled '0'``.

    ``check(namespace)`` raises (a NetprobeError or ValueError) for options the server would
    refuse; it runs once per option of the file (one the command line overrides too), so
    the error names that line.
    """
    from netprobe.uci import load

    path = args.uci
    section = _server_section(load(path), path)
    _refuse_if_disabled(section, path)
    by_key = _options_by_key(actions)
    trial = argparse.Namespace(**vars(args))
    blame = _checks_alone(check, args)
    for option in section.options:
        if option.key == "enabled":
            continue
        action = by_key.get(option.key)
        if action is None:
            raise ParseError(f"unknown option {option.key!r} in config {SECTION}"
                             f"{_nearest(option.key, by_key)}", path, option.line)
        value = _value(action, option, path)
        given = getattr(args, action.dest) != action.default  # on the command line
        if blame:
            # checked even where the command line wins: a bad file is bad either way
            probe = argparse.Namespace(**vars(trial))
            setattr(probe, action.dest, value)
            try:
                check(probe)
            except (NetprobeError, ValueError) as exc:
                raise ParseError(f"option {option.key} {', '.join(option.values)!r}: "
                                 f"{exc}", path, option.line) from None
        if not given:
            setattr(trial, action.dest, value)
    vars(args).update(vars(trial))


def _server_section(sections: Sequence[Any], path: str) -> Any:
    """The one ``config server`` section (ParseError for another type, or none, or two)."""
    found = None
    for section in sections:
        if section.type != SECTION:
            raise ParseError(f"config {section.type!r}: netprobe reads only config "
                             f"{SECTION}", path, section.line)
        if found is not None:
            raise ParseError(f"a second config {SECTION} section (the first is at line "
                             f"{found.line}): one server per file", path, section.line)
        found = section
    if found is None:
        raise ParseError(f"no config {SECTION} section", path)
    return found


def _refuse_if_disabled(section: Any, path: str) -> None:
    option = next((o for o in section.options if o.key == "enabled"), None)
    if option is None:
        return
    if option.is_list or option.values[0] not in (*_TRUE, *_FALSE):
        raise ParseError(f"option enabled {option.values[-1]!r}: must be '1' or '0'", path,
                         option.line)
    if option.values[0] in _FALSE:
        raise UsageError(f"{path}:{option.line}: option enabled {option.values[0]!r}: this "
                         "server is disabled (set enabled '1' to start it)")


def _options_by_key(actions: Sequence[argparse.Action]) -> dict[str, argparse.Action]:
    """UCI key -> the action of the long option it names, for the kinds a file can set:
    a value, a repeatable value, a flag."""
    by_key = {}
    for action in actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or action.dest in _NOT_UCI or not _settable(action):
            continue
        by_key[longs[0][2:].replace("-", "_")] = action
    return by_key


def _settable(action: argparse.Action) -> bool:
    if isinstance(action, (argparse._StoreAction, argparse._AppendAction)):
        return action.nargs is None
    return isinstance(action, argparse._StoreTrueAction)


def _value(action: argparse.Action, option: Any, path: str) -> Any:
    """The option's value as the command line's parser would have made it."""
    repeatable = isinstance(action, argparse._AppendAction)
    if option.is_list and not repeatable:
        raise ParseError(f"{option.key} takes one value: option {option.key} '...', not a "
                         "list", path, option.line)
    if isinstance(action, argparse._StoreTrueAction):
        text = option.values[0]
        if text not in (*_TRUE, *_FALSE):
            raise ParseError(f"option {option.key} {text!r}: must be '1' or '0'", path,
                             option.line)
        return text in _TRUE
    values = [_converted(action, option, text, path) for text in option.values]
    return values if repeatable else values[0]


def _converted(action: argparse.Action, option: Any, text: str, path: str) -> Any:
    try:
        value = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
        raise ParseError(f"option {option.key} {text!r}: {exc}", path,
                         option.line) from None
    if action.choices is not None and value not in action.choices:
        shown = ", ".join(map(repr, action.choices))
        raise ParseError(f"option {option.key} {text!r}: must be one of {shown}", path,
                         option.line)
    if not isinstance(value, str) or value.strip():
        return value
    raise ParseError(f"option {option.key} is empty", path, option.line)


def _checks_alone(check: Callable[[argparse.Namespace], Any],
                  args: argparse.Namespace) -> bool:
    """Whether the command line alone passes ``check``: if not, its own error is reported
    as it always is, and no line of the file is blamed for it."""
    try:
        check(args)
    except (NetprobeError, ValueError):
        return False
    return True


def _nearest(key: str, by_key: dict[str, argparse.Action]) -> str:
    import difflib

    near = difflib.get_close_matches(key, list(by_key), n=1)
    return f" (did you mean {near[0]}?)" if near else ""


__all__ = ["SECTION", "apply_uci"]
