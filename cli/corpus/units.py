"""Turning a folder of files into corpus units for the corpus tree.

Pure Python, no gRPC and no tokenizer: the CLI (``suffixd warm``) walks and
splits files here and ships the units' *text* to the daemon, which tokenizes
them with its own tokenizer. Keeping this side free of the model means a warm
client starts instantly and never disagrees with the daemon about tokens.

A *unit* is one sequence in the corpus tree. Units end where a draft should be
allowed to end: a SQL statement, a paragraph, an assistant turn. A unit may
consist of several *segments* that the daemon tokenizes separately and
concatenates, so that a workload turn's header (``"<assistant>\\n"``) is
tokenized exactly as the replay protocol of ``shared/data/README.md`` does.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("suffixd.corpus")

# Bump when the splitting rules change: the version is part of every file's
# content hash, so the next warm re-ingests files whose units would now differ.
SPLITTER_VERSION = 1

# Text files up to this size are one unit; bigger ones are cut per paragraph.
WHOLE_TEXT_LIMIT = 16 * 1024
# Longer units are cut at line ends (a minified file, a giant paragraph): one unit
# must fit in one request, and a draft never needs context further back than this.
MAX_UNIT_CHARS = 64 * 1024
# Files bigger than this are skipped: a corpus is documents, not data dumps.
MAX_FILE_BYTES = 256 * 1024 * 1024
# How much of a file's head is sniffed for NUL bytes to call it binary.
_SNIFF_BYTES = 8192

SQL_SUFFIXES = {".sql"}
TEXT_SUFFIXES = {".md", ".markdown", ".txt", ".rst", ".text"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}


@dataclass(frozen=True)
class Unit:
    """One corpus sequence: its segments are tokenized separately and concatenated."""

    segments: tuple[str, ...]

    @property
    def text(self) -> str:
        return "".join(self.segments)

    @property
    def chars(self) -> int:
        return sum(len(s) for s in self.segments)


@dataclass
class CorpusFile:
    """A file read and split: what a warm sends for it."""

    path: str  # relative to the corpus root, '/'-separated: the file's key in the store
    abs_path: Path
    content_hash: str
    size: int
    kind: str  # "sql" | "text" | "workload" | "jsonl"
    units: list[Unit] = field(default_factory=list)
    # Units the daemon already holds of this version (an interrupted warm): sent from here.
    resume_from: int = 0

    @property
    def chars(self) -> int:
        return sum(u.chars for u in self.units)


class SkipFile(Exception):
    """The file cannot be ingested (binary, unreadable, too big); the message says why."""


# --------------------------------------------------------------------------- walking


def matches(rel_path: str, includes: Sequence[str], excludes: Sequence[str] = ()) -> bool:
    """Whether a '/'-separated relative path is selected by the include/exclude globs.

    A glob without '/' matches the file name (``*.sql`` matches ``a/b/c.sql``,
    as users of ``find -name`` or ``rsync`` expect); a glob with '/' matches
    the whole relative path. No includes means every file.
    """

    def hit(glob: str) -> bool:
        if "/" in glob:
            return fnmatch.fnmatchcase(rel_path, glob.lstrip("/")) or fnmatch.fnmatchcase(
                rel_path, glob
            )
        return fnmatch.fnmatchcase(rel_path.rsplit("/", 1)[-1], glob)

    if any(hit(g) for g in excludes):
        return False
    return not includes or any(hit(g) for g in includes)


def walk(
    root: str | Path, includes: Sequence[str] = (), excludes: Sequence[str] = ()
) -> Iterator[tuple[str, Path]]:
    """Yield (relative path, absolute path) of the selected regular files, in sorted order.

    Hidden files and folders (dot-names: ``.git``, editor swap files) are never
    corpus content. Symlinked folders are not followed, which also rules out
    cycles; symlinked files are read like regular files.
    """
    root = Path(root)
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in filenames:
            if name.startswith("."):
                continue
            abs_path = Path(dirpath) / name
            rel = abs_path.relative_to(root).as_posix()
            if matches(rel, includes, excludes):
                found.append((rel, abs_path))
    # Sorted by relative path, so runs (and resumed runs) go through files in one order.
    found.sort()
    for rel, abs_path in found:
        if abs_path.is_file():
            yield rel, abs_path


def relative_key(root: str | Path, path: str | Path) -> str | None:
    """The store key of ``path`` under ``root``, or None when it is outside or hidden."""
    try:
        rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).as_posix()
    except ValueError:
        return None
    if rel in ("", ".") or any(part.startswith(".") for part in rel.split("/")):
        return None
    return rel


# --------------------------------------------------------------------------- hashing


def content_hash(data: bytes) -> str:
    """The file's identity for idempotent warming (splitter version included)."""
    h = hashlib.sha256()
    h.update(f"suffixd-corpus-v{SPLITTER_VERSION}\x00".encode())
    h.update(data)
    return h.hexdigest()


# --------------------------------------------------------------------------- SQL


def split_sql(text: str) -> list[str]:
    """Split SQL text into statements at semicolons that are really statement ends.

    Semicolons inside '...' and "..." strings (doubled quotes and backslash
    escapes included), `...` and [...] identifiers, -- and # line comments,
    /* */ block comments and PostgreSQL $tag$ dollar quotes do not split.
    Each statement keeps its own terminating semicolon (agents write it too)
    and is stripped of surrounding whitespace; empty statements are dropped.
    A last statement without a semicolon is kept.
    """
    out: list[str] = []
    n = len(text)
    start = 0
    i = 0
    while i < n:
        c = text[i]
        if c in ("'", '"', "`"):
            i = _skip_quoted(text, i, c)
        elif c == "[":
            j = text.find("]", i + 1)
            i = n if j < 0 else j + 1
        elif c == "-" and text.startswith("--", i) or c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
        elif c == "/" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
        elif c == "$":
            i = _skip_dollar(text, i)
        elif c == ";":
            stmt = text[start : i + 1].strip()
            if stmt != ";":
                out.append(stmt)
            i += 1
            start = i
        else:
            i += 1
    tail = text[start:].strip()
    if tail and not _only_comments(tail):
        out.append(tail)
    return out


def _skip_quoted(text: str, i: int, quote: str) -> int:
    """Index just past the string/identifier opened at ``i`` (end of text if unterminated)."""
    n = len(text)
    j = i + 1
    while j < n:
        c = text[j]
        if c == "\\" and quote != "`":
            j += 2
            continue
        if c == quote:
            if j + 1 < n and text[j + 1] == quote:  # doubled quote is an escaped quote
                j += 2
                continue
            return j + 1
        j += 1
    return n


def _skip_dollar(text: str, i: int) -> int:
    """Past a $tag$...$tag$ body starting at ``i``; one character when it is not one."""
    j = i + 1
    n = len(text)
    while j < n and (text[j].isalnum() or text[j] == "_"):
        j += 1
    if j >= n or text[j] != "$" or (j > i + 1 and text[i + 1].isdigit()):
        return i + 1  # "$1" parameters and lone dollars are ordinary characters
    tag = text[i : j + 1]
    end = text.find(tag, j + 1)
    return n if end < 0 else end + len(tag)


def _only_comments(sql: str) -> bool:
    rest = sql
    while rest:
        rest = rest.lstrip()
        if rest.startswith("--") or rest.startswith("#"):
            nl = rest.find("\n")
            rest = "" if nl < 0 else rest[nl + 1 :]
        elif rest.startswith("/*"):
            end = rest.find("*/")
            rest = "" if end < 0 else rest[end + 2 :]
        else:
            return not rest
    return True


# --------------------------------------------------------------------------- text


def split_paragraphs(text: str) -> list[str]:
    """Paragraphs separated by blank lines, each stripped of trailing whitespace.

    Fenced code blocks (```) are kept whole even when they contain blank lines:
    a draft that crosses a blank line inside a function is still one unit of
    meaning.
    """
    paras: list[str] = []
    cur: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        if not line.strip() and not in_fence:
            if cur:
                paras.append("\n".join(cur).rstrip())
                cur = []
            continue
        cur.append(line)
    if cur:
        paras.append("\n".join(cur).rstrip())
    return [p for p in paras if p.strip()]


def split_text(text: str, whole_limit: int = WHOLE_TEXT_LIMIT) -> list[str]:
    if not text.strip():
        return []
    if len(text) <= whole_limit:
        return [text.strip("\n")]
    return split_paragraphs(text)


# --------------------------------------------------------------------------- JSONL


def _is_workload_record(obj: object) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("messages"), list)
        and all(isinstance(m, dict) and "role" in m for m in obj["messages"])
    )


def split_jsonl(text: str, roles: Sequence[str] = ("assistant",)) -> tuple[str, list[Unit]]:
    """Units of a JSONL file: the given roles' turns for workload files, else one per line.

    Returns the kind found ("workload" or "jsonl"). Workload turns follow the
    replay protocol: segment ``"<role>\\n"`` then the content, tokenized apart.
    Lines that are not valid JSON are still text an agent may write again, so
    they become plain units rather than errors.
    """
    units: list[Unit] = []
    workload = None
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            obj = None
        if workload is None:
            workload = _is_workload_record(obj)
        if workload and _is_workload_record(obj):
            assert isinstance(obj, dict)
            for m in obj["messages"]:
                content = m.get("content")
                if m.get("role") in roles and isinstance(content, str) and content:
                    units.append(Unit((f"<{m['role']}>\n", content)))
        else:
            units.append(Unit((line.strip(),)))
    return ("workload" if workload else "jsonl"), units


# --------------------------------------------------------------------------- files


def kind_of(path: str | Path) -> str:
    suffix = Path(path).suffix.lower()
    if suffix in SQL_SUFFIXES:
        return "sql"
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    return "text"


def read_bytes(path: Path, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise SkipFile(f"larger than {max_bytes} bytes ({size})")
        return path.read_bytes()
    except OSError as exc:
        raise SkipFile(f"unreadable: {exc.strerror or exc}") from exc


def decode_text(data: bytes) -> str:
    if b"\x00" in data[:_SNIFF_BYTES]:
        raise SkipFile("binary (contains NUL bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SkipFile(f"binary or not UTF-8 (byte {exc.start})") from exc
    return text.removeprefix("\ufeff")


def cap_units(units: list[Unit], max_chars: int = MAX_UNIT_CHARS) -> list[Unit]:
    """Cut units longer than ``max_chars`` into pieces, at line ends where there are any."""
    out: list[Unit] = []
    for u in units:
        if u.chars <= max_chars:
            out.append(u)
            continue
        text = u.text
        start = 0
        while start < len(text):
            end = min(start + max_chars, len(text))
            if end < len(text):
                nl = text.rfind("\n", start + 1, end)
                if nl > start:
                    end = nl + 1
            out.append(Unit((text[start:end],)))
            start = end
    return out


def split_file(
    rel_path: str,
    data: bytes,
    *,
    whole_limit: int = WHOLE_TEXT_LIMIT,
    roles: Sequence[str] = ("assistant",),
) -> tuple[str, list[Unit]]:
    """(kind, units) of a file's bytes; raises SkipFile for binary content."""
    text = decode_text(data)
    kind = kind_of(rel_path)
    if kind == "sql":
        units = [Unit((s,)) for s in split_sql(text)]
    elif kind == "jsonl":
        kind, units = split_jsonl(text, roles)
    else:
        units = [Unit((p,)) for p in split_text(text, whole_limit)]
    return kind, cap_units(units)


def load_file(
    rel_path: str,
    abs_path: Path,
    *,
    data: bytes | None = None,
    whole_limit: int = WHOLE_TEXT_LIMIT,
    roles: Sequence[str] = ("assistant",),
) -> CorpusFile:
    """Read, hash and split one file; raises SkipFile (with the reason) when it cannot be."""
    if data is None:
        data = read_bytes(abs_path)
    kind, units = split_file(rel_path, data, whole_limit=whole_limit, roles=roles)
    return CorpusFile(
        path=rel_path,
        abs_path=abs_path,
        content_hash=content_hash(data),
        size=len(data),
        kind=kind,
        units=units,
    )


def hash_file(abs_path: Path) -> str:
    """Content hash without splitting: enough to decide that a file is unchanged."""
    return content_hash(read_bytes(abs_path))


def batch_units(
    files: Iterable[CorpusFile], max_chars: int
) -> Iterator[list[tuple[CorpusFile, int, int]]]:
    """Group files' units into batches of about ``max_chars`` characters.

    Yields lists of (file, first unit index, end unit index) slices; a big file
    is spread over several batches, a batch holds many small files. One batch
    becomes one request and one LMDB transaction on the daemon side. A file's
    slices start at its ``resume_from`` (units the daemon already holds); it always
    gets at least one slice, possibly empty, which ends it.
    """
    batch: list[tuple[CorpusFile, int, int]] = []
    size = 0
    for f in files:
        start = f.resume_from
        chars = 0
        for i in range(f.resume_from, len(f.units)):
            chars += f.units[i].chars
            if size + chars >= max_chars:
                batch.append((f, start, i + 1))
                yield batch
                batch, size, chars, start = [], 0, 0, i + 1
        if start < len(f.units) or start == f.resume_from:
            batch.append((f, start, len(f.units)))
            size += chars
    if batch:
        yield batch
