"""Errors a user can act on. The CLI turns them into one-line messages and exit codes."""


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
