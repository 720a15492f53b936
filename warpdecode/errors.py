"""The few exception types warpdecode raises at its boundaries.

The CLI turns any `WarpdecodeError` into a one-line message and a non-zero exit code.
"""


class WarpdecodeError(Exception):
    """Base class of every error meant for the user rather than a traceback."""


class ConfigError(WarpdecodeError, ValueError):
    """A configuration, argument or input value is invalid."""


class CheckpointError(WarpdecodeError):
    """A checkpoint or model directory is missing, incomplete or corrupt."""


class CapabilityError(WarpdecodeError):
    """A requested combination is not supported (e.g. a backend cannot provide hidden states)."""


class PackageIntegrityError(WarpdecodeError):
    """An exported package failed its hash or version check."""
