"""The ``suffixd.v1.Corpus`` service: warming a namespace's corpus tree from files.

Two layers: :class:`CorpusIngest` works on the Engine (store + trees, no gRPC) and
:class:`CorpusServicer` maps the wire messages onto it. ``register(server, engine)``
adds the service to a grpc.Server.

Store records (LMDB ``doc`` database, via ``suffixcache.store.Txn``), one per file::

    ns NUL path -> {"seqs": [seq ids], "hash": content hash, "tokens": n, "t": time,
                    "complete": bool, "size": bytes, "kind": "sql" | ..., "meta": {}}

compatible with ``Engine.add_corpus_document`` records (which lack "complete" and
are complete by construction). Sequences are ``kind="corpus"`` with ``doc=path``,
so the engine's rebuild puts them back into the corpus tree and maps them to
their file for the "top documents" statistics.

Throughput: a WarmFiles stream is processed in two stages on two threads, so
both cores work: a reader thread receives and tokenizes request i+1 (llama.cpp
tokenization releases the GIL) while the RPC thread commits request i in one
LMDB transaction and indexes it in the corpus tree (native, GIL released).
"""

from __future__ import annotations

import builtins
import logging
import queue
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from suffixd.v1 import corpus_pb2, corpus_pb2_grpc

from suffixcache.store import DiskFullError

from ..common.errors import EngineError, FailedPrecondition, InvalidArgument, ResourceExhausted
from ..common.logs import event
from .registrar import ServiceRegistrar

log = logging.getLogger("suffixd.corpus")

SERVICE_NAME = "suffixd.v1.Corpus"
_MAX_NAME_BYTES = 256
_MAX_PATH_BYTES = 4096


def _check_name(what: str, value: str, limit: int) -> None:
    if not value:
        raise InvalidArgument(f"{what} must not be empty")
    if "\x00" in value:
        raise InvalidArgument(f"{what} must not contain NUL characters")
    try:
        n = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} is not valid UTF-8") from None
    if n > limit:
        raise InvalidArgument(f"{what} is longer than {limit} bytes")


@dataclass
class Chunk:
    """A file chunk with its units tokenized."""

    path: str
    content_hash: str
    first: bool
    last: bool
    sequences: list[list[int]]
    size: int = 0
    kind: str = ""
    offset: int = 0  # index of the chunk's first unit in the file (resuming: > 0)


@dataclass
class WarmResult:
    units: int = 0
    tokens: int = 0
    completed: list[str] = field(default_factory=list)
    replaced_sequences: int = 0


class CorpusIngest:
    """Corpus file bookkeeping on top of the Engine's store and cache."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        # Serialises commits and their tree updates, so that two warms of one namespace
        # cannot index a file's sequences in a different order than they committed.
        self._commit_lock = threading.Lock()

    # -- tokenization -------------------------------------------------------
    def tokenize_units(self, units: Sequence[Sequence[str]]) -> list[list[int]]:
        tok = self.engine.tokenizer
        if tok is None:
            raise FailedPrecondition("this daemon has no tokenizer (started without a model)")
        out: list[list[int]] = []
        for segments in units:
            ids: list[int] = []
            for s in segments:
                if s:
                    ids.extend(tok.tokenize(s))
            out.append(ids)
        return out

    # -- writes -------------------------------------------------------------
    def commit(self, ns: str, chunks: Sequence[Chunk]) -> WarmResult:
        """Store the chunks in one durable transaction, then index them."""
        _check_name("namespace", ns, _MAX_NAME_BYTES)
        self.engine.admit_namespace(ns)  # a warm may be a namespace's first state
        limit = self.engine.limits.max_tokens_per_call
        total = 0
        for ch in chunks:
            _check_name("path", ch.path, _MAX_PATH_BYTES)
            total += sum(map(len, ch.sequences))
        if total > limit * 16:
            # A batch must stay one reasonable transaction; the CLI sends ~1 MB batches.
            raise ResourceExhausted(f"{total} tokens in one warm request; send smaller batches")
        now = time.time()

        def write(t: Any) -> tuple[list[tuple[int, list[int], str]], list[int], list[str]]:
            # seq id -> (tokens, path), in insertion order
            added: dict[int, tuple[list[int], str]] = {}
            removed: list[int] = []
            completed: list[str] = []
            for ch in chunks:
                rec = t.get_doc(ns, ch.path)
                if ch.first:
                    if rec is not None:
                        for s in rec.get("seqs", []):
                            t.delete_sequence(s)
                            # A file restarted within this request: its first version
                            # never reaches the tree.
                            if added.pop(s, None) is None:
                                removed.append(s)
                    rec = {"seqs": [], "hash": ch.content_hash, "meta": {}, "tokens": 0,
                           "t": now, "complete": False, "size": ch.size, "kind": ch.kind}
                elif (rec is None or rec.get("hash") != ch.content_hash
                      or rec.get("complete", True)):
                    raise InvalidArgument(
                        f"chunk of {ch.path!r} without its first chunk (send first=true first)"
                    )
                elif ch.offset and rec.get("units") != ch.offset:
                    raise InvalidArgument(
                        f"chunk of {ch.path!r} starts at unit {ch.offset} but the daemon holds "
                        f"{rec.get('units', 'an unknown number of')} units of it; send the "
                        "file from its start"
                    )
                # Units received, empty ones included: where an interrupted warm resumes.
                rec["units"] = rec.get("units", 0) + len(ch.sequences)
                for toks in ch.sequences:
                    if toks:
                        sid = t.add_sequence(ns, "corpus", toks, doc=ch.path)
                        rec["seqs"].append(sid)
                        rec["tokens"] += len(toks)
                        added[sid] = (toks, ch.path)
                if ch.last:
                    rec["complete"] = True
                    completed.append(ch.path)
                rec["t"] = now
                t.put_doc(ns, ch.path, rec)
                hook = getattr(self.engine, "ingest_hook", None)
                if ch.last and hook is not None:
                    # The fleet publishes a file once complete, whole (its earlier chunks
                    # committed in earlier transactions).
                    seqs = [(t.get_sequence(s) or {}).get("tokens", []) for s in rec["seqs"]]
                    hook(t, "doc", ns, key=ch.path, seqs=seqs,
                                            hash=ch.content_hash,
                                            meta={"kind": ch.kind, "size": ch.size})
            return [(sid, tp[0], tp[1]) for sid, tp in added.items()], removed, completed

        with self._commit_lock:
            try:
                added, removed, completed = self.engine.store.write(write)
            except DiskFullError as exc:
                raise ResourceExhausted(str(exc)) from None
            self._unindex(ns, removed)
            cache = self.engine.cache
            docs = self.engine._corpus_docs
            for sid, toks, path in added:
                cache.add_corpus(ns, sid, toks)
                docs[(ns, sid)] = path
        return WarmResult(
            units=len(added),
            tokens=sum(len(a[1]) for a in added),
            completed=completed,
            replaced_sequences=len(removed),
        )

    def _unindex(self, ns: str, seq_ids: Sequence[int]) -> None:
        if seq_ids:
            # Through the engine: a background rebuild after a restart would otherwise
            # put a replaced file's old sequences back into the tree.
            self.engine.remove_from_trees(ns, "corpus", seq_ids)

    def remove(self, ns: str, paths: Sequence[str]) -> tuple[int, int]:
        """Drop files (and their sequences); returns (files found, sequences removed)."""
        _check_name("namespace", ns, _MAX_NAME_BYTES)
        for p in paths:
            _check_name("path", p, _MAX_PATH_BYTES)

        def write(t: Any) -> tuple[int, list[int]]:
            found = 0
            removed: list[int] = []
            for p in paths:
                rec = t.get_doc(ns, p)
                if rec is None:
                    continue
                found += 1
                for s in rec.get("seqs", []):
                    t.delete_sequence(s)
                    removed.append(s)
                t.delete_doc(ns, p)
                hook = getattr(self.engine, "ingest_hook", None)
                if hook is not None:
                    hook(t, "undoc", ns, key=p)
            return found, removed

        with self._commit_lock:
            found, removed = self.engine.store.write(write)
            self._unindex(ns, removed)
        return found, len(removed)

    # -- reads --------------------------------------------------------------
    def list(self, ns: str, prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
        _check_name("namespace", ns, _MAX_NAME_BYTES)
        return [
            (key, rec)
            for _, key, rec in self.engine.store.iter_docs(ns)
            if key.startswith(prefix)
        ]

    # builtins.list: the method above shadows the name in this class's body
    def check(self, ns: str, files: Sequence[tuple[str, str]]) -> builtins.list[str]:
        _check_name("namespace", ns, _MAX_NAME_BYTES)
        warm = []
        for path, h in files:
            if not path or "\x00" in path:
                continue
            rec = self.engine.store.get_doc(ns, path)
            if rec is not None and rec.get("hash") == h and rec.get("complete", True):
                warm.append(path)
        return warm


def _abort(context: grpc.ServicerContext, exc: EngineError) -> None:
    context.abort(getattr(grpc.StatusCode, exc.code, grpc.StatusCode.INTERNAL), str(exc))


_DONE = object()


class CorpusServicer(corpus_pb2_grpc.CorpusServicer):
    def __init__(self, engine: Any) -> None:
        self.ingest = CorpusIngest(engine)

    def WarmFiles(  # noqa: N802 (gRPC method name)
        self, request_iterator: Iterator[corpus_pb2.WarmRequest], context: grpc.ServicerContext
    ) -> Iterator[corpus_pb2.WarmReply]:
        # Bounded: the reader stays at most two requests ahead of the commits.
        prepared: queue.Queue[Any] = queue.Queue(maxsize=2)
        stop = threading.Event()

        def reader() -> None:
            open_files: dict[str, str] = {}  # path -> hash of files begun, not finished
            try:
                for req in request_iterator:
                    if stop.is_set():
                        return
                    chunks = []
                    for c in req.chunks:
                        if c.first or (c.offset and c.path not in open_files):
                            # A resumed file (offset > 0): commit checks it against the
                            # stored, incomplete version.
                            open_files[c.path] = c.content_hash
                        elif open_files.get(c.path) != c.content_hash:
                            raise InvalidArgument(
                                f"chunk of {c.path!r} without its first chunk in this stream"
                            )
                        if c.last:
                            open_files.pop(c.path, None)
                        seqs = self.ingest.tokenize_units([tuple(u.segments) for u in c.units])
                        chunks.append(Chunk(c.path, c.content_hash, c.first, c.last, seqs,
                                            c.size, c.kind, c.offset))
                    prepared.put((req.namespace, chunks))
                prepared.put(_DONE)
            except EngineError as exc:
                prepared.put(exc)
            except grpc.RpcError:
                prepared.put(_DONE)  # the client went away; nothing more to commit
            except Exception as exc:  # never leave the RPC thread waiting
                log.exception("corpus warm reader failed")
                prepared.put(exc)

        t = threading.Thread(target=reader, name="suffixd-corpus-reader", daemon=True)
        t.start()
        totals = WarmResult()
        t0 = time.perf_counter()
        # Time the commit stage sat waiting for tokenized input: near 0 means the tree
        # insert (this stage) limits the warm, large means tokenization/transport does.
        idle = 0.0
        try:
            while True:
                w0 = time.perf_counter()
                item = prepared.get()
                idle += time.perf_counter() - w0
                if item is _DONE:
                    break
                if isinstance(item, EngineError):
                    _abort(context, item)
                if isinstance(item, Exception):
                    context.abort(grpc.StatusCode.INTERNAL, f"warm failed: {item}")
                ns, chunks = item
                try:
                    res = self.ingest.commit(ns, chunks)
                except EngineError as exc:
                    _abort(context, exc)
                totals.units += res.units
                totals.tokens += res.tokens
                totals.completed.extend(res.completed)
                yield corpus_pb2.WarmReply(
                    units=res.units,
                    tokens=res.tokens,
                    completed=res.completed,
                    replaced_sequences=res.replaced_sequences,
                )
        finally:
            stop.set()
            # Unblock a reader waiting on the full queue so the thread can end.
            while t.is_alive():
                try:
                    prepared.get_nowait()
                except queue.Empty:
                    t.join(0.05)
            dt = time.perf_counter() - t0
            event(log, "corpus.warm", files=len(totals.completed), units=totals.units,
                  tokens=totals.tokens, seconds=round(dt, 3), commit_idle_s=round(idle, 3),
                  tokens_per_s=round(totals.tokens / dt) if dt > 0 else 0)

    def CheckFiles(  # noqa: N802
        self, request: corpus_pb2.CheckFilesRequest, context: grpc.ServicerContext
    ) -> corpus_pb2.CheckFilesResponse:
        try:
            warm = self.ingest.check(
                request.namespace, [(f.path, f.content_hash) for f in request.files]
            )
        except EngineError as exc:
            _abort(context, exc)
        return corpus_pb2.CheckFilesResponse(warm=warm)

    def RemoveFiles(  # noqa: N802
        self, request: corpus_pb2.RemoveFilesRequest, context: grpc.ServicerContext
    ) -> corpus_pb2.RemoveFilesResponse:
        try:
            files, seqs = self.ingest.remove(request.namespace, list(request.paths))
        except EngineError as exc:
            _abort(context, exc)
        if files:
            event(log, "corpus.remove", ns=request.namespace, files=files, sequences=seqs)
        return corpus_pb2.RemoveFilesResponse(files=files, sequences=seqs)

    def ListFiles(  # noqa: N802
        self, request: corpus_pb2.ListFilesRequest, context: grpc.ServicerContext
    ) -> corpus_pb2.ListFilesResponse:
        try:
            rows = self.ingest.list(request.namespace, request.prefix)
        except EngineError as exc:
            _abort(context, exc)
        return corpus_pb2.ListFilesResponse(
            files=[
                corpus_pb2.FileInfo(
                    path=key,
                    content_hash=str(rec.get("hash") or ""),
                    complete=bool(rec.get("complete", True)),
                    sequences=len(rec.get("seqs", [])),
                    tokens=int(rec.get("tokens", 0)),
                    warmed_at=float(rec.get("t", 0.0)),
                    size=int(rec.get("size", 0)),
                    kind=str(rec.get("kind", "")),
                    units=int(rec.get("units", 0)),
                )
                for key, rec in rows
            ]
        )


def register(server: ServiceRegistrar, engine: Any) -> list[str]:
    """Add the Corpus service to ``server`` (before it starts); returns its name."""
    corpus_pb2_grpc.add_CorpusServicer_to_server(CorpusServicer(engine), server)
    # The warm pipeline hands work between a tokenizer thread and native tree inserts,
    # both of which release the GIL; with the default 5 ms switch interval each hand-over
    # waits out the other thread's slice (a convoy). 0.5 ms measured 178k -> 242k tokens/s
    # warming on 2 cores, and it also shortens RPC latency under mixed load.
    if sys.getswitchinterval() > 0.0005:
        sys.setswitchinterval(0.0005)
    return [SERVICE_NAME]
