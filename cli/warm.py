"""``suffixd warm``: ingest a folder into a namespace's corpus tree through the daemon.

The client walks, hashes and splits files (suffixd.cli.corpus.units) and streams the
units' text; the daemon tokenizes and stores them. Idempotent: files are keyed
by absolute path with a content hash, so unchanged files are never sent, changed
ones replace their old sequences, and files gone from the folder are dropped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import grpc

# connection_options, describe_error, resolve_target: shared with the other client
# commands (cli/common.py), still importable from here.
from suffixd.cli.common import connection_options, describe_error, resolve_target  # noqa: F401
from suffixd.cli.corpus.units import (
    CorpusFile,
    SkipFile,
    batch_units,
    content_hash,
    load_file,
    read_bytes,
    relative_key,
    walk,
)
from suffixd.client.errors import SuffixdError

# Characters of unit text per WarmFiles request: one request is one LMDB transaction;
# big enough to amortise the fsync, small enough to keep the pipeline busy and the
# message well under the daemon's size limit.
BATCH_CHARS = 1 << 20
_MAX_MSG = 64 << 20


# --------------------------------------------------------------------------- connecting


def connect(address: str | None, socket: str | None, data_dir: str | None,
            token: str | None) -> Any:
    from suffixd.cli.common import connect as _connect

    return _connect(address, socket, data_dir, token, max_message_bytes=_MAX_MSG)


# --------------------------------------------------------------------------- warming


@dataclass
class WarmStats:
    scanned: int = 0
    warmed: int = 0
    unchanged: int = 0
    removed: int = 0
    skipped: int = 0
    units: int = 0
    tokens: int = 0
    replaced_sequences: int = 0
    resumed: int = 0  # files continued after the units an interrupted warm stored
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "warnings"}
        d["tokens_per_s"] = round(self.tokens_per_s, 1)
        d["seconds"] = round(self.seconds, 3)
        return d


class Warmer:
    """One corpus root in one namespace, kept in sync with the daemon."""

    def __init__(
        self,
        client: Any,
        root: str | Path,
        namespace: str,
        includes: Iterable[str] = (),
        excludes: Iterable[str] = (),
        roles: Iterable[str] = ("assistant",),
        warn: Callable[[str], None] = lambda msg: None,
        batch_chars: int = BATCH_CHARS,
    ) -> None:
        from suffixd.v1 import corpus_pb2, corpus_pb2_grpc

        self.pb = corpus_pb2
        self.client = client
        self.stub = client.stub_for(corpus_pb2_grpc.CorpusStub)
        self.root = Path(os.path.abspath(root))
        self.ns = namespace
        self.includes = tuple(includes)
        self.excludes = tuple(excludes)
        self.roles = tuple(roles)
        self.warn = warn
        self.batch_chars = batch_chars
        # doc key -> (hash, complete) as the daemon has it
        self.known: dict[str, tuple[str, bool]] = {}
        # doc key -> (hash, units stored) of files an interrupted warm left incomplete
        self.partial: dict[str, tuple[str, int]] = {}

    def key(self, rel: str) -> str:
        return (self.root / rel).as_posix()

    def refresh_known(self) -> None:
        resp = self.client.call(
            self.stub.ListFiles,
            self.pb.ListFilesRequest(namespace=self.ns, prefix=self.root.as_posix() + "/"),
        )
        self.known = {f.path: (f.content_hash, f.complete) for f in resp.files}
        self.partial = {f.path: (f.content_hash, f.units) for f in resp.files
                        if not f.complete and f.units}

    def is_warm(self, key: str, h: str) -> bool:
        return self.known.get(key) == (h, True)

    def remove(self, keys: list[str], stats: WarmStats) -> None:
        for i in range(0, len(keys), 1000):
            part = keys[i : i + 1000]
            resp = self.client.call(
                self.stub.RemoveFiles, self.pb.RemoveFilesRequest(namespace=self.ns, paths=part)
            )
            stats.removed += resp.files
            for k in part:
                self.known.pop(k, None)

    def scan(self, stats: WarmStats) -> list[tuple[str, Path]]:
        """Files to (re)send; files gone from disk are removed from the daemon."""
        self.refresh_known()
        todo: list[tuple[str, Path]] = []
        seen: set[str] = set()
        for rel, path in walk(self.root, self.includes, self.excludes):
            stats.scanned += 1
            key = self.key(rel)
            seen.add(key)
            try:
                h = content_hash(read_bytes(path))
            except SkipFile as exc:
                stats.skipped += 1
                self.warn(f"skipped {rel}: {exc}")
                continue
            if self.is_warm(key, h):
                stats.unchanged += 1
            else:
                todo.append((rel, path))
        gone = [k for k in self.known if k not in seen and not os.path.lexists(k)]
        if gone:
            self.remove(gone, stats)
        return todo

    def _load(self, items: Iterable[tuple[str, Path]], stats: WarmStats) -> Iterator[CorpusFile]:
        for rel, path in items:
            try:
                f = load_file(rel, path, roles=self.roles)
            except SkipFile as exc:
                stats.skipped += 1
                self.warn(f"skipped {rel}: {exc}")
                key = self.key(rel)
                if key in self.known:  # a warm file that turned binary/unreadable
                    self.remove([key], stats)
                continue
            f.path = self.key(rel)
            if self.is_warm(f.path, f.content_hash):
                stats.unchanged += 1
                continue
            h, stored = self.partial.pop(f.path, ("", 0))
            if h == f.content_hash and 0 < stored <= len(f.units):
                f.resume_from = stored  # the same version, cut short: send the rest
                stats.resumed += 1
            yield f

    def send(
        self,
        items: Iterable[tuple[str, Path]],
        stats: WarmStats,
        on_reply: Callable[[Any], None] = lambda reply: None,
    ) -> None:
        """Stream the files' units; returns once every batch is durable on the daemon."""
        pb = self.pb
        hashes: dict[str, str] = {}

        def requests() -> Iterator[Any]:
            for batch in batch_units(self._load(items, stats), self.batch_chars):
                chunks = []
                for f, a, b in batch:
                    hashes[f.path] = f.content_hash
                    chunks.append(pb.FileChunk(
                        path=f.path, content_hash=f.content_hash,
                        first=a == 0, last=b == len(f.units),
                        units=[pb.CorpusUnit(segments=u.segments) for u in f.units[a:b]],
                        size=f.size, kind=f.kind, offset=a,
                    ))
                yield pb.WarmRequest(namespace=self.ns, chunks=chunks)

        # Not client.call (unary only): a broken stream is not retried, the next warm resumes.
        for reply in self.stub.WarmFiles(requests(), metadata=self.client.metadata):
            stats.units += reply.units
            stats.tokens += reply.tokens
            stats.replaced_sequences += reply.replaced_sequences
            stats.warmed += len(reply.completed)
            for key in reply.completed:
                self.known[key] = (hashes.pop(key, ""), True)
            on_reply(reply)

    def warm_all(self, progress: bool = True, out: Any = None) -> WarmStats:
        stats = WarmStats()
        t0 = time.perf_counter()
        todo = self.scan(stats)
        bar = None
        stream = out or sys.stderr
        # Not into a log file or a pipe: tqdm's \r frames would fill it.
        if progress and todo and stream.isatty():
            from tqdm import tqdm

            bar = tqdm(total=len(todo), unit="file", desc=f"warming {self.ns}",
                       file=stream, dynamic_ncols=True)

        def on_reply(reply: Any) -> None:
            if bar is not None:
                dt = time.perf_counter() - t0
                bar.set_postfix_str(
                    f"{stats.tokens:,} tokens, {stats.tokens / dt if dt else 0:,.0f} tok/s",
                    refresh=False,
                )
                bar.update(len(reply.completed))

        try:
            self.send(todo, stats, on_reply)
        finally:
            if bar is not None:
                bar.close()
            stats.seconds = time.perf_counter() - t0
        return stats

    # -- watch mode ---------------------------------------------------------
    def apply_changes(self, changes: Mapping[str, str], stats: WarmStats) -> None:
        """Apply a debounced batch of (absolute path -> op) from the watcher."""
        upserts: dict[str, Path] = {}
        deletes: list[str] = []
        for path, _op in changes.items():
            p = Path(path)
            rel = relative_key(self.root, p)
            if rel is None:
                continue
            # The op only says what happened last; the disk says what is true now.
            if p.is_dir():
                for sub_rel, sub in walk(p, self.includes, self.excludes):
                    upserts[self.key(f"{rel}/{sub_rel}")] = sub
            elif p.is_file():
                from suffixd.cli.corpus.units import matches

                if matches(rel, self.includes, self.excludes):
                    upserts[self.key(rel)] = p
            else:
                prefix = self.key(rel)
                deletes.extend(k for k in self.known
                               if (k == prefix or k.startswith(prefix + "/"))
                               and not os.path.lexists(k))
        if deletes:
            self.remove(sorted(set(deletes)), stats)
        if upserts:
            items = [(relative_key(self.root, k) or k, p) for k, p in sorted(upserts.items())]
            self.send(items, stats)


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _print_summary(stats: WarmStats, as_json: bool) -> None:
    if as_json:
        import json

        click.echo(json.dumps(stats.as_dict()))
        return
    click.echo(
        f"{plural(stats.scanned, 'file')} scanned: {stats.warmed} warmed, "
        f"{stats.unchanged} unchanged, {stats.removed} removed, {stats.skipped} skipped; "
        + (f"{plural(stats.resumed, 'file')} resumed; " if stats.resumed else "")
        + f"{stats.units:,} units, "
        f"{stats.tokens:,} tokens in {stats.seconds:.2f} s ({stats.tokens_per_s:,.0f} tokens/s)"
    )


@click.command("warm")
@click.option("--corpus", "corpus_dir", required=True,
              type=click.Path(exists=True, file_okay=False, readable=True),
              help="Folder to ingest (walked recursively).")
@click.option("--namespace", "-n", default="default", show_default=True,
              help="Namespace whose corpus tree receives the files.")
@click.option("--include", "includes", multiple=True, metavar="GLOB",
              help="Only files matching GLOB (name, or relative path if it has '/'). Repeatable.")
@click.option("--exclude", "excludes", multiple=True, metavar="GLOB",
              help="Skip files matching GLOB. Repeatable.")
@click.option("--roles", default="assistant", show_default=True,
              help="Comma-separated message roles taken from workload JSONL files.")
@click.option("--watch", is_flag=True, help="Keep running and follow changes until interrupted.")
@click.option("--debounce", default=0.3, show_default=True, type=click.FloatRange(0, 60),
              help="Seconds of quiet before a burst of changes is applied (--watch).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--batch-chars", default=BATCH_CHARS, hidden=True, type=click.IntRange(1000),
              help="Characters of text per request (one LMDB transaction each).")
@connection_options
def warm(
    corpus_dir: str,
    namespace: str,
    includes: tuple[str, ...],
    excludes: tuple[str, ...],
    roles: str,
    watch: bool,
    debounce: float,
    as_json: bool,
    no_progress: bool,
    batch_chars: int,
    address: str | None,
    socket_path: str | None,
    data_dir: str | None,
    auth_token: str | None,
) -> None:
    """Warm a namespace's corpus tree with the files of a folder.

    \b
    Units: a SQL file per statement, a text/markdown file whole (per paragraph
    when big), a workload JSONL per assistant turn (--roles), other JSONL per line.
    Re-running is cheap: unchanged files are skipped by content hash, changed
    files replace their old sequences, deleted files are dropped.

    \b
    Example:
      suffixd warm --corpus sql/ --namespace sql --include '*.sql' --watch
    """
    client = connect(address, socket_path, data_dir, auth_token)

    def warn(msg: str) -> None:
        click.echo(f"warning: {msg}", err=True)

    warmer = Warmer(client, corpus_dir, namespace, includes, excludes,
                    [r.strip() for r in roles.split(",") if r.strip()], warn=warn,
                    batch_chars=batch_chars)
    # SIGTERM (a service manager stopping --watch) ends the command like Ctrl-C does.
    old_handler = signal.signal(signal.SIGTERM, _interrupt) if watch else None
    watcher = None
    watching = False
    try:
        if watch:
            from suffixd.cli.corpus.watch import CorpusWatcher, Debouncer

            # Started before the first pass, so changes made during it are not missed.
            watcher = CorpusWatcher(warmer.root, includes, excludes,
                                    Debouncer(quiet_s=debounce, max_delay_s=max(debounce, 5.0)))
            watcher.start()
        stats = warmer.warm_all(progress=not no_progress and not as_json)
        _print_summary(stats, as_json)
        if watcher is not None:
            click.echo(f"watching {warmer.root} (Ctrl-C to stop)", err=True)
            watching = True
            while True:
                changes = watcher.debouncer.wait(timeout=1.0)
                if not changes:
                    continue
                st = WarmStats()
                t0 = time.perf_counter()
                try:
                    warmer.apply_changes(changes, st)
                except (grpc.RpcError, SuffixdError) as exc:
                    # The daemon restarting must not end the watch: retry the batch later,
                    # against a fresh view of what the daemon has.
                    warn(f"{describe_error(exc, client.target)}; retrying in 2 s")
                    time.sleep(2.0)
                    for path, op in changes.items():
                        watcher.debouncer.add(path, op)
                    with contextlib.suppress(grpc.RpcError, SuffixdError):
                        warmer.refresh_known()
                    continue
                st.seconds = time.perf_counter() - t0
                if st.warmed or st.removed or st.skipped:
                    click.echo(
                        f"{time.strftime('%H:%M:%S')} warmed {plural(st.warmed, 'file')} "
                        f"({st.tokens:,} tokens), removed {st.removed}, skipped {st.skipped}",
                        err=True,
                    )
    except KeyboardInterrupt:
        if watching:
            click.echo("stopped watching", err=True)
            return
        click.echo("interrupted; what was acknowledged is stored, the next warm resumes",
                   err=True)
        sys.exit(130)
    except (grpc.RpcError, SuffixdError) as exc:
        raise click.ClickException(describe_error(exc, client.target)) from None
    finally:
        if watcher is not None:
            with contextlib.suppress(Exception):
                watcher.stop()
        if old_handler is not None:
            signal.signal(signal.SIGTERM, old_handler)
        client.close()
