"""Exit codes and the user-facing error type shared by every command."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    """Exit codes of every `provision` command (documented in docs/commands.md)."""

    OK = 0  # success / no drift
    FAIL = 1  # validation errors, failed or unreachable hosts, health failures
    USAGE = 2  # bad arguments, unreadable files
    DRIFT = 3  # drift found (drift only)


class UsageError(Exception):
    """A user error (missing file, unreadable YAML, bad argument).

    The CLI prints the message (no traceback) and exits 2.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)
