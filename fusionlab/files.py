"""Writing files so that a reader never sees half of one, with the mode a plain `open()` would give."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_write", "replacing", "umask", "default_mode"]

_UMASK_LOCK = threading.Lock()


def umask() -> int:
    """The process's umask (read by setting and restoring it: there is no portable read-only call)."""
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def default_mode(path: str | os.PathLike, executable: bool = False) -> int:
    """The mode `path` gets: an existing file keeps its own; a new one 0o666 (0o777 executable) less the umask.

    `tempfile.mkstemp` creates its file 0o600; renamed into place unchanged, every file we wrote was
    private to its owner whatever the user's umask said (issue 23).
    """
    try:
        return os.stat(path).st_mode & 0o7777
    except OSError:
        return (0o777 if executable else 0o666) & ~umask()


@contextlib.contextmanager
def replacing(path: str | os.PathLike, *, mode: int | None = None) -> Iterator[Path]:
    """A temporary path beside `path` to write; when the block ends it replaces `path` in one rename.

    The file gets `mode` when given, else `default_mode(path)` (what `open(path, "wb")` would leave). If the block
    raises, the temporary file is removed and `path` is untouched: a reader never sees half a file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    final_mode = default_mode(path) if mode is None else mode
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, final_mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: str | os.PathLike, data: bytes, *, mode: int | None = None) -> Path:
    """Write `data` to `path` via a temporary file in the same folder and a rename (`replacing`)."""
    with replacing(path, mode=mode) as tmp:
        tmp.write_bytes(data)
    return Path(path)
