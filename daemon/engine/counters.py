"""Counters (per namespace and per open session), their flushing to LMDB, and ``stats``.

Interface (``Counters``, one per Engine):

* ``load()``: at start-up, the counters the store holds;
* ``bump(ns, sid, key, n)``, ``count_generated(ns, sid, n, response)``,
  ``count_step(ns, sid, source, proposed, accepted)``,
  ``count_document_accept(ns, doc_key, n)``: add to the namespace's counters and (when
  ``sid``) the session's;
* ``forget_session(ns, sid)``: a closed session's counters go (the store drops them with
  the session record);
* ``session_counters(ns, sid)`` -> the derived dict ``describe_session`` shows;
* ``flush()`` (and ``flush_loop``, the ``suffixd-counter-flush`` thread): write the dirty
  counters of namespaces and still-open sessions to LMDB;
* ``stats(ns, session_id, include_sessions, top_documents)`` -> the dict behind the Stats
  RPC, ``suffixd stats`` and the Prometheus collector.

``lock`` guards ``_counters``, ``_docs_accepted`` and ``_dirty``, held for a few
dictionary operations only and never across I/O or another lock (it is the last lock in
the engine's order). Durability: counters live in memory and reach LMDB only through
``flush`` (every ``counter_flush_s`` and at close); a crash loses at most the last
interval's counts, never data.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any

from suffixcache.store import Store, StoreError, Txn

from ..common.errors import InvalidArgument

if TYPE_CHECKING:
    from suffixcache import SuffixCache

    from .session_state import SessionRegistry

log = logging.getLogger("suffixd.engine")

SOURCES = ("session", "global", "corpus", "draft_model", "none")


def new_counters() -> dict[str, Any]:
    return {
        "requests": 0,
        "steps": 0,
        "proposed": 0,
        "accepted": 0,
        "generated": 0,
        "speculate_calls": 0,
        "by_source": {},  # source -> [steps, proposed, accepted]
    }


def derive(c: dict[str, Any]) -> dict[str, Any]:
    """Raw counters -> what the Stats RPC reports (rates, per-source breakdown)."""
    steps, prop, acc = c["steps"], c["proposed"], c["accepted"]
    by_source = {src: {"steps": v[0], "proposed": v[1], "accepted": v[2]}
                 for src, v in sorted(c["by_source"].items())}
    return {
        "requests": c["requests"],
        "steps": steps,
        "draft_tokens_proposed": prop,
        "draft_tokens_accepted": acc,
        "acceptance_rate": acc / prop if prop else 0.0,
        "mean_accepted_per_step": acc / steps if steps else 0.0,
        "by_source": by_source,
        "forward_passes_saved": acc,
        "generated_tokens": c["generated"],
        "speculate_calls": c["speculate_calls"],
    }


class Counters:
    def __init__(self, store: Store, registry: SessionRegistry, cache: SuffixCache) -> None:
        self.store = store
        self.registry = registry
        self.cache = cache
        self.lock = threading.Lock()
        self._counters: dict[tuple[str, str], dict[str, Any]] = {}
        self._docs_accepted: dict[str, dict[str, int]] = {}
        self._dirty: set[tuple[str, str]] = set()

    def load(self) -> None:
        for ns, sid, ctr in self.store.iter_counters():
            docs = ctr.pop("docs", None)
            base = new_counters()
            base.update(ctr)
            self._counters[(ns, sid)] = base
            if docs:
                self._docs_accepted[ns] = {str(k): int(v) for k, v in docs.items()}

    # ------------------------------------------------------------------ counting
    def _ctr(self, ns: str, sid: str) -> dict[str, Any]:
        c = self._counters.get((ns, sid))
        if c is None:
            c = self._counters[(ns, sid)] = new_counters()
        self._dirty.add((ns, sid))
        return c

    def _bump(self, ns: str, sid: str, key: str, n: int) -> None:
        """Add n to a counter of the namespace and (if sid) the session. Needs ``lock``."""
        self._ctr(ns, "")[key] += n
        if sid:
            self._ctr(ns, sid)[key] += n

    def bump(self, ns: str, sid: str, key: str, n: int) -> None:
        with self.lock:
            self._bump(ns, sid, key, n)

    def count_generated(self, ns: str, sid: str, n: int, response: bool) -> None:
        """Tokens a "generated" or "response" append added; a "response" ends a request."""
        with self.lock:
            self._bump(ns, sid, "generated", n)
            if response:
                self._bump(ns, sid, "requests", 1)

    def count_step(self, ns: str, sid: str, source: str, proposed: int, accepted: int) -> None:
        with self.lock:
            for key in ((ns, ""), (ns, sid)) if sid else ((ns, ""),):
                c = self._ctr(*key)
                c["steps"] += 1
                c["proposed"] += proposed
                c["accepted"] += accepted
                bs = c["by_source"].setdefault(source, [0, 0, 0])
                bs[0] += 1
                bs[1] += proposed
                bs[2] += accepted

    def count_document_accept(self, ns: str, doc_key: str, n: int) -> None:
        with self.lock:
            d = self._docs_accepted.setdefault(ns, {})
            d[doc_key] = d.get(doc_key, 0) + n
            self._dirty.add((ns, ""))

    def has_namespace(self, ns: str) -> bool:
        return (ns, "") in self._counters

    def namespaces(self) -> set[str]:
        with self.lock:
            return {k[0] for k in self._counters}

    def forget_namespace(self, ns: str) -> bool:
        """A dropped namespace's counters (the store dropped their records); whether
        there were any."""
        with self.lock:
            keys = [k for k in self._counters if k[0] == ns]
            for key in keys:
                del self._counters[key]
                self._dirty.discard(key)
            return bool(keys) | (self._docs_accepted.pop(ns, None) is not None)

    def forget_session(self, ns: str, sid: str) -> None:
        with self.lock:
            self._counters.pop((ns, sid), None)
            self._dirty.discard((ns, sid))

    def session_counters(self, ns: str, sid: str) -> dict[str, Any]:
        with self.lock:
            return derive(self._counters.get((ns, sid)) or new_counters())

    # ------------------------------------------------------------------ flushing
    def flush(self) -> None:
        with self.lock:
            dirty = list(self._dirty)
            self._dirty.clear()
            snap = {}
            for key in dirty:
                c = self._counters.get(key)
                if c is None:
                    continue
                c2 = json.loads(json.dumps(c))
                if key[1] == "" and key[0] in self._docs_accepted:
                    c2["docs"] = dict(self._docs_accepted[key[0]])
                snap[key] = c2
        if not snap:
            return
        live = self.registry.live(snap)

        def write(t: Txn) -> None:
            for (ns, sid), c in snap.items():
                # (not those of a namespace dropped since the snapshot)
                if (ns, sid) in live and (ns, sid) in self._counters:
                    t.put_counters(ns, sid, c)

        try:
            self.store.write(write)
        except BaseException:
            with self.lock:  # written by a later flush
                self._dirty.update(k for k in snap if k in self._counters)
            raise

    def flush_loop(self, interval: float, stop: threading.Event) -> None:
        failing = False
        while not stop.wait(interval):
            try:
                self.flush()
            except StoreError as exc:
                # A full disk fails every flush until space returns: one line when it starts
                # failing and one when it recovers, not a traceback a second. The counts
                # stay in memory (dirty) and reach LMDB with the next flush that commits.
                if not failing:
                    log.warning("counter flush failed; retrying", extra={"error": str(exc)})
                failing = True
                continue
            except Exception:
                log.exception("counter flush failed")
                continue
            if failing:
                log.info("counter flush recovered")
                failing = False

    # ------------------------------------------------------------------ stats
    def stats(
        self,
        ns: str | None = None,
        session_id: str | None = None,
        include_sessions: bool = False,
        top_documents: int = 10,
        names: list[str] | None = None,
    ) -> dict[str, Any]:
        """``names``: only these namespaces (a page of the Stats RPC), whose counters alone
        are copied."""
        if ns:
            self.registry.validator.check_name("namespace", ns)
        if session_id:
            if not ns:
                raise InvalidArgument("a session id needs its namespace")
            self.registry.get(ns, session_id)
        open_by_ns, sess_tokens = self.registry.snapshot()
        wanted = {ns} if ns else set(names) if names is not None else None
        with self.lock:
            if wanted is not None and not (session_id or include_sessions):
                # a page's namespaces looked up, not every stored key scanned
                keys: list[tuple[str, str]] = [(n, "") for n in wanted
                                                   if (n, "") in self._counters]
            else:
                keys = [k for k in self._counters if wanted is None or k[0] in wanted]
            ctrs = {k: json.loads(json.dumps(self._counters[k])) for k in keys}
            docs = {k: dict(v) for k, v in self._docs_accepted.items()
                    if wanted is None or k in wanted}
        if wanted is None:
            wanted = set(self.cache.namespaces()) | {k[0] for k in ctrs} | set(open_by_ns)
        cache_stats = {n: s for n in wanted for s in self.cache.stats(n).values()}
        out: dict[str, Any] = {}
        for name in sorted(wanted):
            entry: dict[str, Any] = {
                "counters": derive(ctrs.get((name, ""), new_counters())),
                "cache": cache_stats.get(name, {}),
                "open_sessions": open_by_ns.get(name, 0),
                "top_documents": sorted(docs.get(name, {}).items(), key=lambda kv: -kv[1])[
                    : top_documents or 10
                ],
            }
            if session_id or include_sessions:
                entry["sessions"] = {
                    sid: {
                        "counters": derive(ctrs.get((name, sid), new_counters())),
                        "tokens": tok,
                    }
                    for (n, sid), tok in sorted(sess_tokens.items())
                    if n == name and (not session_id or sid == session_id)
                }
            out[name] = entry
        return out
