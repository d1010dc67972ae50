"""A command's flags from a YAML file (``ki collector --config FILE``), checked as the command line is.

The file is a mapping whose keys are the command's long flags without the leading ``--``
(``head-mb: 512``, ``rules: [deploy/rules/*.yml]``, ``local-dev: true``): the parser is the one
definition of what may be set, so a new flag is a key the day it is added, and ``ki collector
--print-config`` writes every key with its default. Each value goes through the flag's own
argparse type, so a bad number reads as it would on the command line, prefixed with the file and
key. Flags given on the command line win over the file; a repeatable flag (``--rules``) adds to
the file's list. docs/configuration.md states the format.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["FlagFileError", "config_path", "flag_actions", "read_flag_file", "settings_yaml"]


class FlagFileError(ValueError):
    """A file that cannot be read, or a key or value the command does not take; the message names both."""


def flag_actions(parser: argparse.ArgumentParser, skip: Sequence[str] = ()) -> dict[str, argparse.Action]:
    """The parser's long flags by key (``--head-mb`` -> ``head-mb``), help and ``skip`` left out."""
    found: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        for option in action.option_strings:
            if option.startswith("--") and option not in skip:
                found[option[2:]] = action
    return found


def config_path(argv: Sequence[str], option: str) -> str | None:
    """The value of ``option`` in ``argv`` (``--config FILE`` or ``--config=FILE``), the last one
    given, or None. Spelled out in full: the file is read before argparse parses the rest."""
    found = None
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == option and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(option + "="):
            found = arg[len(option) + 1 :]
    return found


def _convert(action: argparse.Action, key: str, value: object) -> object:
    """``value`` as the flag ``--key`` would have parsed it, or FlagFileError."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise FlagFileError(f"{key}: expected true or false, got {value!r}")
        return value if isinstance(action, argparse._StoreTrueAction) else not value
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_scalar(action, key, item) for item in items]
    return _scalar(action, key, value)


def _scalar(action: argparse.Action, key: str, value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise FlagFileError(f"{key}: expected a single value, got {value!r}")
    text = str(value)
    try:
        converted = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
        raise FlagFileError(f"{key}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise FlagFileError(f"{key}: expected one of {choices}, got {text!r}")
    return converted


def read_flag_file(parser: argparse.ArgumentParser, path: str | Path, option: str) -> dict[str, Any]:
    """The values the file sets, by argparse destination, each checked by its flag's type.

    Raises FlagFileError naming the file: it cannot be read, it is not a mapping, a key is no
    flag of the command (with the closest one), or a value is refused by the flag's type.
    """
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise FlagFileError(f"{path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FlagFileError(f"{path}: not YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise FlagFileError(f"{path}: expected a mapping of flag names to values, got {type(data).__name__}")
    actions = flag_actions(parser, skip=(option, "--print-config"))
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key)
        action = actions.get(name) or actions.get(name.replace("_", "-"))
        if action is None:
            close = difflib.get_close_matches(name, actions, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise FlagFileError(
                f"{path}: unknown key {name!r}{hint}; keys are the flags of --help without '--'"
            )
        if value is None:
            continue  # ``key:`` with nothing after it: the flag's default
        try:
            values[action.dest] = _convert(action, name, value)
        except FlagFileError as exc:
            raise FlagFileError(f"{path}: {exc}") from None
    return values


def settings_yaml(
    parser: argparse.ArgumentParser, values: argparse.Namespace, skip: Sequence[str] = ()
) -> str:
    """Every flag of ``parser`` as a YAML key with its value in ``values`` (defaults, the file and
    the command line, as parsed) and its help as a comment: a configuration file that reads back
    to the same settings (``ki collector --print-config``)."""
    import yaml

    lines = []
    for key, action in flag_actions(parser, skip).items():
        value: Any = getattr(values, action.dest, action.default)
        if isinstance(action, argparse._StoreFalseAction):
            value = not value
        help_text = " ".join((action.help or "").split())
        if help_text:
            lines.append(f"# {help_text}")
        lines.append(yaml.safe_dump({key: value}, default_flow_style=True, width=1 << 20).strip()[1:-1])
    return "\n".join(lines) + "\n"
