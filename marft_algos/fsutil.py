"""Crash-safe file writes shared by checkpoints and run logs.

A file is replaced atomically by writing a temp file beside it, fsyncing it, ``os.replace``-ing
it over the target and fsyncing the directory, so a crash leaves either the old or the new
file, never a torn one.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "write_text_atomic"]


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (a rename or a new file) to disk; a no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some filesystems refuse to open dirs; rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` atomically: temp file, fsync, ``os.replace``, fsync the dir."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
