"""Errors a user can act on. The CLI turns them into one-line messages and exit codes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from pydantic import ValidationError


class PalominoError(Exception):
    """Base class: the message names what is wrong and how to fix it."""


class ConfigError(PalominoError):
    """A configuration value is missing, unknown or invalid (CLI exit code 2)."""


class DatasetError(PalominoError):
    """A dataset cannot be found or read; the message says which files go where."""


class SnapshotError(PalominoError):
    """A snapshot or checkpoint body is malformed, oversized or fails its checksum."""


class TransportError(PalominoError):
    """The broker or Redis cannot be reached or refused us; the message names the URL."""


def describe_validation(
    error: ValidationError, name: Callable[[str], str] | None = None, *, show_input: bool = True
) -> str:
    """A pydantic error as one line: the first failing field, what is wrong with it, how many more.

    `name`: how the user calls a top-level field (a flag, an environment variable); by default its
    dotted path. `show_input=False` for settings that hold secrets."""
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"]]
    field = (name(loc[0]) if name and loc else ".".join(loc)) or "<root>"
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown key (check its spelling and the docs/configuration.md list)"
    elif show_input and "input" in first and not isinstance(first["input"], dict | list):
        message = f"{message} (got {first['input']!r})"
    more = len(error.errors()) - 1
    return f"{field}: {message}" + (f" (and {more} more error(s))" if more else "")
