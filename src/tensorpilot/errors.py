"""Errors a user can cause. The CLI prints their message as one sentence and exits non-zero;
anything else is a bug and keeps its traceback."""


class TensorpilotError(Exception):
    """A problem with the user's input or environment (exit code 1)."""

    exit_code = 1


class UsageError(TensorpilotError):
    """A malformed command line or configuration (exit code 2, like argparse)."""

    exit_code = 2


class ConfigError(UsageError):
    """A configuration value that is missing, of the wrong type or out of range."""


class PathError(ConfigError):
    """A path the user named that cannot be read or written: missing, a file where a directory
    is needed (or the reverse), under a file, not writable, or too long (exit code 2)."""


class CheckpointError(TensorpilotError):
    """A checkpoint that is missing, unreadable, corrupt or incompatible with the run."""


class TrainingAborted(TensorpilotError):
    """Training stopped on purpose (repeated non-finite losses, interruption)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def user_frame(exc: BaseException) -> str | None:
    """' at FILE:LINE' of the innermost frame of ``exc``'s traceback in neither torch nor
    tensorpilot: the user's code (or a library it calls) that raised; None when every frame is
    torch's or ours (then the failure is not the user's code)."""
    import traceback
    from pathlib import Path

    ours = Path(__file__).resolve().parent
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename).resolve()
        if ours in path.parents or "torch" in path.parts:
            continue
        return f" at {path.name}:{frame.lineno}"
    return None


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (or its type name), at most ``limit`` characters:
    enough to say what a library refused, without its multi-line advice."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:limit]


def exit_at_once(command: str, message: str, code: int = 130):
    """Say ``message`` as the command's one sentence and end the process now, from a signal
    handler. Raising there instead is not safe before work has started: the handler runs between
    any two bytecodes, also inside Python code that C++ called (importing torch), where an
    exception aborts the interpreter."""
    import os
    import sys

    sys.stderr.write(f"tensorpilot {command}: error: {message}\n")
    sys.stderr.flush()
    os._exit(code)
