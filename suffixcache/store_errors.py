"""The store's errors, and telling a full disk from other write failures."""

from __future__ import annotations

import errno
import os
from pathlib import Path

# Below this much free space a failed commit is put down to a full disk (LMDB reports a
# short write of its pages as an I/O error, not ENOSPC).
FULL_BELOW_BYTES = 1 << 20


class StoreError(Exception):
    """Base class of the store's errors."""


class StoreFileError(StoreError):
    """A file of the store cannot be used as it is (a link, not a regular file, empty,
    truncated, not an LMDB file or damaged): the store was not opened, or a read found the
    damage. ``path``: the file; the message says what is wrong and the way out."""

    def __init__(self, path: Path, problem: str, way_out: str) -> None:
        super().__init__(f"the store file {path} {problem}; {way_out}")
        self.path = path


class DiskFullError(StoreError):
    """A write transaction failed for want of disk space; nothing of it was stored, the
    store stays usable and later writes succeed once space is freed."""


def free_bytes(path: str | Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_disk_full(path: str | Path, exc: BaseException) -> bool:
    """Whether ``exc`` (raised by a write or commit) means the disk under ``path`` is
    full."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    if "No space left" in text or "quota exceeded" in text.lower():
        return True
    free = free_bytes(path)
    return "Input/output error" in text and free is not None and free < FULL_BELOW_BYTES
