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


class Failure(Exception):
    """A failure that stops a command (the ledger cannot be opened or written, ...): the CLI prints the message as
    one `error:` line (no traceback) and exits 1."""


def describe(exc: BaseException) -> str:
    """One line for an unexpected exception caught to keep a run going: its type, its message with the path(s) an
    OSError names (its repr drops them), and where it was raised: the innermost frame of ours (`provisioner/...`)
    and, when the error came from deeper (the standard library, ansible-runner), that frame too."""
    import traceback
    from pathlib import Path

    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    if not frames:
        return text
    here = Path(__file__).resolve().parent
    ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(here)]
    where = [f"{Path(f.filename).resolve().relative_to(here.parent)}:{f.lineno}" for f in ours[-1:]]
    if not ours or ours[-1] is not frames[-1]:
        where.append(f"{Path(frames[-1].filename).name}:{frames[-1].lineno}")
    return f"{text} (at {' via '.join(where)})"
