"""File helpers shared by the trial runner, the grader and the results store."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def fsync(path: Path) -> None:
    """Flush ``path`` (a file, or a directory after a link, rename or unlink in it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` so readers see the old file or the whole new one, never a half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A temporary of its own: with one shared name, racing writers renamed each other's away.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # as write_text would make it (mkstemp's is 0600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_tree(root: Path) -> None:
    """Delete a work dir even where it (or code run in it) made directories read-only."""
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
    if root.exists():
        os.chmod(root, stat.S_IRWXU)
    shutil.rmtree(root, ignore_errors=True)


class InputFileError(ValueError):
    """A file a spec points at cannot be read as bounded UTF-8 text; the message names it."""


def read_text_bounded(path: Path, limit: int, what: str) -> str:
    """``path`` as UTF-8 text, refused (InputFileError) before reading past ``limit`` bytes.

    Only regular files: /dev/zero or a FIFO would read (or block) forever. The file is
    opened non-blocking and checked again on its descriptor, so a swap after the first
    look changes nothing; a file that grows (or a /proc file that claims size 0) is cut
    off at ``limit`` + 1 bytes.
    """
    try:
        kind = _kind(os.stat(path).st_mode)
        if kind is not None:
            raise InputFileError(f"{path}: the {what} is {kind}, not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise InputFileError(f"{path}: cannot read the {what} ({err.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        kind = _kind(st.st_mode)
        if kind is not None:
            raise InputFileError(f"{path}: the {what} is {kind}, not a regular file")
        if st.st_size > limit:
            raise InputFileError(
                f"{path}: the {what} is {st.st_size} bytes, over the limit of {limit} bytes"
            )
        try:
            data = f.read(limit + 1)
        except OSError as err:
            raise InputFileError(f"{path}: cannot read the {what} ({err.strerror})") from None
    if len(data) > limit:
        raise InputFileError(f"{path}: the {what} is over the limit of {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputFileError(
            f"{path}: the {what} is not UTF-8 text ({err.reason} at byte {err.start}: "
            f"{data[err.start : err.start + 1]!r}); save it as UTF-8"
        ) from None


def _kind(mode: int) -> str | None:
    """What a non-regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


@contextmanager
def try_lock(path: Path) -> Iterator[bool]:
    """An exclusive flock on ``path`` (created, never deleted), without waiting: yields
    whether this process holds it. Closing the file drops it, a crash included."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
