"""User-facing errors.

Every mistake a user can make (a mistyped key, a missing file, a corrupted shard) raises a subclass of
:class:`UserError`. The CLI turns it into a one-line message and exit code 2, with no traceback. Internal
invariants use ``assert`` and are bugs when they fire.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix; the message names the key/file/value and how to fix it."""

    exit_code = 2


class ConfigError(UserError):
    """An invalid configuration key or value."""


class DataError(UserError):
    """A missing, empty, unreadable or corrupted corpus, shard or tokenizer."""


class CheckpointError(UserError):
    """A missing, incompatible or corrupted checkpoint, or a run directory conflict."""
