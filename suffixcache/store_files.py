"""The store's two files, checked before LMDB opens them and once it has.

LMDB opens ``data.mdb`` and ``lock.mdb`` by name, with no ``O_NOFOLLOW``: a symbolic link
there is written through (``lock.mdb``'s target becomes a reader table), and a FIFO blocks
the open for good. It takes an empty ``data.mdb`` for a new store (the data is gone, and
nobody is told), and maps a truncated one as it is: the first read past its end kills the
process with SIGBUS. So, before the open: each file that exists must be a regular file
(``lstat``: links are not followed), ``data.mdb`` not empty; after it: the names still
lead to the files LMDB holds open (a link swapped in between is refused, though LMDB may
have written its lock table through it by then: only the store's owner can swap entries
of its 0700 directory), and ``data.mdb`` reaches the last page LMDB's meta page names.
Damage LMDB itself reports (not an LMDB file, another format version, corrupted pages)
is raised as the same error.

Interface: ``check_before_open(path)``, ``check_after_open(path, env)``, ``damaged(path,
exc)``; ``DAMAGE`` (LMDB's errors that mean the file is damaged). Each raises or returns a
``StoreFileError`` (suffixcache/store_errors.py) naming the file and the way out.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import lmdb

from .store_errors import StoreFileError

DATA = "data.mdb"
LOCK = "lock.mdb"

DAMAGE: tuple[type[lmdb.Error], ...] = (
    lmdb.InvalidError, lmdb.VersionMismatchError, lmdb.CorruptedError,
    lmdb.PageNotFoundError, lmdb.PanicError, lmdb.IncompatibleError,
    # a read transaction is only poisoned by a failed page read: damage too
    lmdb.BadTxnError,
)

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def _restore(path: Path) -> str:
    store = path.parent
    return (f"restore a copy of {store}, or move {store} aside to start with an empty "
            "store")


def _refuse_entry(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        way_out = ("remove the link (LMDB makes a new lock file)" if path.name == LOCK
                   else "put the file itself there instead of the link")
        raise StoreFileError(path, "is a symbolic link, which the store does not follow "
                             "(LMDB would write through it)", way_out)
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "no regular file")
        raise StoreFileError(path, f"is {kind}, not a regular file",
                             f"move it aside, then restore a copy of {path.parent} or "
                             "start with an empty store")


def check_before_open(path: Path) -> None:
    """``data.mdb`` and ``lock.mdb`` under the store directory ``path``, where they exist:
    regular files, not links; ``data.mdb`` not empty. Raises ``StoreFileError``."""
    for name in (DATA, LOCK):
        f = path / name
        try:
            st = os.lstat(f)
        except FileNotFoundError:
            continue  # a new store: LMDB creates it
        _refuse_entry(f, st)
        if name == DATA and st.st_size == 0:
            raise StoreFileError(f, "is empty (0 bytes): the store's data is gone",
                                 _restore(f))


def _held_files() -> set[tuple[int, int]] | None:
    """(device, inode) of every file this process holds open; None without /proc."""
    fds = "/proc/self/fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return None
    held = set()
    for n in names:
        with contextlib.suppress(OSError):  # closed meanwhile (another thread's)
            st = os.stat(f"{fds}/{n}")
            held.add((st.st_dev, st.st_ino))
    return held


def check_after_open(path: Path, env: lmdb.Environment) -> None:
    """Once LMDB opened the store at ``path``: the files under their names are the ones it
    holds, and ``data.mdb`` is as long as its meta page says. Raises ``StoreFileError``
    (the caller closes ``env``)."""
    held = _held_files()
    for name in (DATA, LOCK):
        f = path / name
        try:
            st = os.lstat(f)
        except FileNotFoundError:
            raise StoreFileError(f, "was removed while the store opened",
                                 "start again") from None
        _refuse_entry(f, st)
        if held is not None and (st.st_dev, st.st_ino) not in held:
            raise StoreFileError(f, "was replaced while the store opened (LMDB opened "
                                 "another file)", "start again")
    size = os.lstat(path / DATA).st_size
    need = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    if size < need:
        raise StoreFileError(path / DATA, f"is truncated ({size} bytes; its pages end at "
                             f"{need})", _restore(path / DATA))


def damaged(path: Path, exc: lmdb.Error) -> StoreFileError:
    """The error for damage LMDB reported (one of ``DAMAGE``) in the store at ``path``."""
    reason = str(exc).removeprefix(f"{path}: ")
    return StoreFileError(path / DATA, f"is not a readable LMDB store ({reason})",
                          _restore(path / DATA))
