"""Files only their owner may read (tokens, keys, the App's .env, the index), written whole,
and the directories that hold them.

Modes are given where a file or directory is made and set again with chmod, so the umask
(which only ever takes bits away, and may be 0) decides nothing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, mode 0600 from its first byte: a reader finds the old file
    or the new one, never a part, and nobody else ever could read it."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, FILE_MODE)  # whatever the umask
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner may enter (0700), made if missing (its parents
    as usual); one that exists is narrowed to 0700: it is the app's own (the data directory)."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)
    return path


def private_file(path: Path) -> Path:
    """`path` made empty with mode 0600 if missing, else narrowed to 0600 when it is the
    app's (its owner's); before anything is written to it (SQLite opens it next, and makes
    its -wal and -shm files with the main file's mode)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o777 != FILE_MODE and st.st_uid == os.getuid():
            os.fchmod(fd, FILE_MODE)  # whatever the umask, or an older release, made
    finally:
        os.close(fd)
    return path


def narrow(path: Path) -> None:
    """An existing file of the app's (its owner's) narrowed to 0600; a missing one is left."""
    with contextlib.suppress(FileNotFoundError):
        st = path.stat()
        if st.st_mode & 0o777 != FILE_MODE and st.st_uid == os.getuid():
            os.chmod(path, FILE_MODE)
