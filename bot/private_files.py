"""Files only their owner may read (tokens, keys, the App's .env), written whole."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, mode 0600 from its first byte: a reader finds the old file
    or the new one, never a part, and nobody else ever could read it."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o600)  # whatever the umask
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
