"""The data directory's guards: one daemon per directory (or socket path), owner-only
files.

Interface: ``DataDirLock(data_dir, path=None)`` with ``acquire()`` (an exclusive
``flock`` on ``<data dir>/suffixd.lock``, or on ``path``, holding the daemon's pid;
raises ``ServeError`` naming the daemon that holds it) and ``release()``;
``owner_only(data_dir)`` (0700 / 0600 on the directory and everything in it);
``write_private(path, text)`` (a file replaced atomically, 0600 from its creation on:
what the daemon writes after the owner-only pass, e.g. daemon.json, metrics.addr).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from .serve_config import ServeError


class DataDirLock:
    """Exclusive lock on a data directory, held for the daemon's lifetime."""

    def __init__(self, data_dir: Path, path: Path | None = None) -> None:
        self.path = path or data_dir / "suffixd.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            try:
                other = os.read(fd, 64).decode().strip() or "?"
            finally:
                os.close(fd)
            raise ServeError(
                f"another suffixd daemon (pid {other}) is already using the data directory "
                f"{self.path.parent}; stop it or pass another --data-dir"
                if self.path.name == "suffixd.lock" else
                f"another suffixd daemon (pid {other}) is listening on "
                f"{self.path.with_suffix('')}; stop it or listen elsewhere"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


def owner_only(data_dir: Path) -> None:
    """The data dir and everything in it owner-only (0700 / 0600), whatever modes an
    earlier run or an operator left: it holds the users' text and the store."""
    with contextlib.suppress(OSError):
        os.chmod(data_dir, 0o700)
    for root, dirs, files in os.walk(data_dir):
        for d in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, d), 0o700)
        for f in files:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, f), 0o600)


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, owner-only (0600) from the first byte, atomically.
    ``Path.write_text`` creates with 0666 less the umask (0644 as usually run): a file
    written after ``owner_only`` would be left readable by everyone."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a leftover tmp file keeps its old mode through O_CREAT
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
