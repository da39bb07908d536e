"""Paths a user names and files a run writes: checked before any heavy work, written atomically.

Every command that reads or writes a user-named path checks it here first, so a bad path (a file
where a directory is needed, a directory under a file, no permission, a name too long for the
file system) ends in one sentence before data is loaded or a model is built. Files that must
never be seen half-written (summaries, configs, job files, caches) go through
:func:`write_atomic`: a temporary file in the same directory, fsync'd, then renamed over the old
one (rename is atomic within one file system, POSIX rename(2)). Whole directories (checkpoints)
go through :func:`publish_dir`: written aside, then exchanged with the old one in one step.

Pure standard library: the CLI and the torch-free planner use it.
"""

from __future__ import annotations

import errno
import math
import shutil
import os
import uuid
from pathlib import Path

from tensorpilot.errors import PathError, TensorpilotError

__all__ = ["os_reason", "writable_dir", "output_file", "existing_path", "read_text", "write_atomic",
           "fsync_path"]


def os_reason(exc: OSError) -> str:
    """'permission denied', 'file name too long', ...: the OS's reason in a few words."""
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system"
    if exc.errno == errno.ENOTDIR:
        return "a part of the path is a file, not a directory"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.EROFS:
        return "the file system is read-only"
    if exc.errno == errno.ENOSPC:
        return "no space left on the device"
    return (exc.strerror or str(exc) or type(exc).__name__).lower()


def _expand(path: str | os.PathLike) -> Path:
    return Path(path).expanduser()


def writable_dir(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a directory this process can create files in (created with its parents if
    missing), or a PathError naming ``what`` (e.g. "run directory", "--out")."""
    p = _expand(path)
    try:
        if p.exists() and not p.is_dir():
            raise PathError(f"{what} {str(path)!r} is a file, not a directory.")
        p.mkdir(parents=True, exist_ok=True)
        # access() answers for the real uid and ignores read-only mounts; a probe file does not
        probe = p / f".tensorpilot-write-test-{uuid.uuid4().hex[:8]}"
        probe.touch()
        probe.unlink()
    except PathError:
        raise
    except FileExistsError:           # mkdir(parents) met a file in the middle of the path
        raise PathError(f"{what} {str(path)!r} cannot be created: a part of the path is a file.") from None
    except OSError as exc:
        raise PathError(f"{what} {str(path)!r} is not a writable directory: {os_reason(exc)}.") from None
    return p


def output_file(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a file this process can write (its directory created if missing). A symlink
    is followed: the file it points to is written, the link itself stays (an atomic rename would
    otherwise replace the link, e.g. /dev/stdout, by a regular file)."""
    if str(path).endswith(("/", os.sep)):
        raise PathError(f"{what} {str(path)!r} names a directory; give a file name.")
    p = _expand(path)
    try:
        if p.is_symlink():
            p = p.resolve()
        if p.is_dir():
            raise PathError(f"{what} {str(path)!r} is a directory; give a file name.")
        if p.exists() and not p.is_file():       # write_atomic's rename would replace a FIFO or device
            raise PathError(f"{what} {str(path)!r} is not a regular file.")
        too_long = len(p.name.encode()) > 255
    except OSError as exc:
        raise PathError(f"{what} {str(path)!r} cannot be written: {os_reason(exc)}.") from None
    if too_long:
        raise PathError(f"{what} {str(path)!r} cannot be written: the name is too long for the file system.")
    writable_dir(p.parent, f"the directory of {what}")
    return p


def existing_path(path: str | os.PathLike, what: str, kind: str = "any") -> Path:
    """``path`` if it exists and is readable (``kind``: "file", "dir" or "any"), else a PathError."""
    p = _expand(path)
    try:
        if not p.exists():
            raise PathError(f"{what} {str(path)!r} does not exist.")
        if kind == "file" and p.is_dir():
            raise PathError(f"{what} {str(path)!r} is a directory; give a file.")
        if kind == "dir" and not p.is_dir():
            raise PathError(f"{what} {str(path)!r} is a file; give a directory.")
        if not os.access(p, os.R_OK | (os.X_OK if p.is_dir() else 0)):
            raise PathError(f"{what} {str(path)!r} cannot be read: permission denied.")
    except PathError:
        raise
    except OSError as exc:
        raise PathError(f"{what} {str(path)!r} cannot be read: {os_reason(exc)}.") from None
    return p


def read_text(path: str | os.PathLike, what: str, limit_bytes: int = 1 << 20) -> str:
    """A small UTF-8 text file the user named (a configuration): a regular file of at most
    ``limit_bytes``, never a FIFO or a device that would block or never end."""
    p = existing_path(path, what, "file")
    try:
        if not p.is_file():
            raise PathError(f"{what} {str(path)!r} is not a regular file.")
        if p.stat().st_size > limit_bytes:
            raise PathError(f"{what} {str(path)!r} is larger than {limit_bytes >> 10:,} KiB; "
                            "is it the right file?")
        with open(p, "rb") as fh:
            data = fh.read(limit_bytes + 1)
    except PathError:
        raise
    except OSError as exc:
        raise PathError(f"{what} {str(path)!r} cannot be read: {os_reason(exc)}.") from None
    try:
        return data.decode("utf-8-sig")              # a byte-order mark is not part of the text
    except UnicodeDecodeError:
        raise PathError(f"{what} {str(path)!r} is not UTF-8 text.") from None


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's entry to disk (a rename is durable once its parent is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: str | bytes, what: str = "file") -> Path:
    """Replace ``path`` by ``data`` so a reader sees the old file or the new one, never a part."""
    p = _expand(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
        fsync_path(p.parent)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise TensorpilotError(f"cannot write {what} {str(p)!r}: {os_reason(exc)}.") from None
    return p


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries in one atomic step (Linux >= 3.15, glibc >= 2.28); False
    where the OS or the file system cannot (then the caller falls back to two renames)."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd, rename_exchange = -100, 2                     # <fcntl.h>, <linux/fs.h>
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def publish_dir(tmp: Path, final: Path) -> None:
    """Put the complete directory ``tmp`` at ``final``, replacing what is there. Readers see the
    old directory or the new one under ``final``, never a mix and never nothing (where the OS
    exchanges names; elsewhere a crash between the two renames leaves the previous step as the
    newest complete checkpoint)."""
    root = final.parent
    if final.exists():
        if _exchange(tmp, final):                           # ``tmp`` now holds the old directory
            fsync_path(root)
            shutil.rmtree(tmp, ignore_errors=True)
            return
        aside = final.with_name(f"{final.name}.old-{os.getpid()}")
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
        os.rename(tmp, final)
        fsync_path(root)
        shutil.rmtree(aside, ignore_errors=True)
        return
    os.rename(tmp, final)
    fsync_path(root)


def finite(obj):
    """``obj`` with every non-finite float (NaN, infinity) replaced by None, through dicts, lists
    and tuples: strict JSON (RFC 8259) has no NaN or Infinity."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj
