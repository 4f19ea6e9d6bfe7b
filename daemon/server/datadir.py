"""The data directory's guards: one daemon per directory (or socket path), owner-only
files.

Interface: ``DataDirLock(data_dir, path=None)`` with ``acquire()`` (an exclusive
``flock`` on ``<data dir>/suffixd.lock``, or on ``path``, holding the daemon's pid;
raises ``ServeError`` naming the daemon that holds it) and ``release()``;
``owner_only(data_dir)`` (0700 / 0600 on the directory and everything in it);
``write_private(path, text)`` (a file replaced atomically, 0600 from its creation on:
what the daemon writes after the owner-only pass, e.g. daemon.json, metrics.addr);
``check_store_dir(path)`` (``<data dir>/store`` a directory, not a link: ``ServeError``).

No symbolic link inside the data dir is followed: the mode pass skips them (chmod would
change the mode of whatever they point to, outside the directory too), files are opened
with ``O_NOFOLLOW``, a lock file that is a link or not a regular file is refused, and so
are a store directory that is a link and LMDB's files when they are links or no regular
files (suffixcache/store_files.py: LMDB opens them by name). The directory itself may be
a link (an operator's choice of where it lives).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
from pathlib import Path

from .serve_config import ServeError

log = logging.getLogger("suffixd.server")


class DataDirLock:
    """Exclusive lock on a data directory, held for the daemon's lifetime."""

    def __init__(self, data_dir: Path, path: Path | None = None) -> None:
        self.path = path or data_dir / "suffixd.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise ServeError(f"{self.path} is a symbolic link: the daemon follows none "
                             "for its lock files; remove it") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ServeError(f"{self.path} is not a regular file; remove it")
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
    earlier run or an operator left: it holds the users' text and the store. Symbolic
    links are left alone (one log line each): chmod would follow them."""
    with contextlib.suppress(OSError):
        os.chmod(data_dir, 0o700)
    # The directory is 0700 from here on: only its owner can swap an entry for a link
    # between the lstat and the chmod below.
    for root, dirs, files in os.walk(data_dir):
        for name, mode in [(d, 0o700) for d in dirs] + [(f, 0o600) for f in files]:
            path = os.path.join(root, name)
            try:
                if stat.S_ISLNK(os.lstat(path).st_mode):
                    log.warning("a symbolic link in the data dir: its mode and its "
                                "target's are left alone, and the daemon does not follow it",
                                extra={"path": path})
                    continue
                os.chmod(path, mode)
            except OSError:
                continue


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, owner-only (0600) from the first byte, atomically.
    ``Path.write_text`` creates with 0666 less the umask (0644 as usually run): a file
    written after ``owner_only`` would be left readable by everyone."""
    tmp = path.with_name(path.name + ".tmp")
    # A leftover goes first: O_EXCL | O_NOFOLLOW then creates the file itself, never
    # writing through a link or into a file of another mode (the rename replaces a link
    # at ``path`` itself, not its target).
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.fchmod(fd, 0o600)  # against a umask that takes bits O_CREAT asked for
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        # named after the file asked for: the error would name the temporary one, which
        # the user never sees (daemon.json a directory read as 'daemon.json.tmp')
        raise OSError(exc.errno, exc.strerror, str(path)) from None


def check_store_dir(path: Path) -> None:
    """``<data dir>/store``, where it exists: a directory of its own. A link would take the
    store, and LMDB's writes, wherever it points."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise ServeError(f"{path} is a symbolic link: the daemon follows none in its data "
                         "dir; move the store directory itself there instead of the link")
    if not stat.S_ISDIR(st.st_mode):
        raise ServeError(f"{path} is not a directory (the daemon keeps its store there); "
                         "move it aside")
