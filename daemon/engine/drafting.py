"""Drafting and its feedback: proposals over a session's trees, and counting the steps.

Interface (``Drafting``, one per Engine):

* ``drafter``: the daemon's Drafter (the CPU cost profile unless replaced);
  ``drafter_for(cost_profile)``: the Drafter for a per-request profile (an LRU of 16;
  InvalidArgument when the profile is bad);
* ``propose(ns, session_id, context, max_tokens, cost_profile, remember)`` -> Draft:
  ``context=None`` drafts from the session's tail; ``remember`` keeps the draft on the
  session so that the next "generated"/"response" append is judged against it;
* ``draft(ns, session_id, sess, ctx, max_tokens, drafter, remember)``: the same once
  validated and looked up (session streams call it per step);
* ``record_step(ns, session_id, source, proposed, accepted, draft, accepted_tokens)``: one
  verified step: the counters, the drafter's calibration (``Drafter.observe``), the
  observers, and the corpus document the accepted tokens came from;
* ``accepted_along(draft, appended)``: how much of an append follows the draft.

Nothing here is durable: counters reach LMDB through ``counters.flush``, calibration is
in memory. ``_drafters_lock`` guards the per-profile LRU only (a leaf lock). A session's
``last_draft`` is written under no lock (a stream or a verifier drives one session from
one thread at a time); SuffixCache and Drafter are thread-safe on their own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from suffixcache.drafter import Draft, accepted_length

from ..common.config import CacheConfig
from ..common.errors import InvalidArgument, NotFound
from .counters import SOURCES, Counters
from .session_state import TAIL_KEEP, Session, SessionRegistry

if TYPE_CHECKING:
    from suffixcache import SuffixCache

    from .budgets import NamespaceLimit
    from .trees import TreeIndex

log = logging.getLogger("suffixd.engine")


def accepted_along(draft: Any, appended: Sequence[int]) -> int:
    """Longest prefix of ``appended`` that follows a root-to-leaf path of the draft tree
    (a suffixcache Draft, or the draft model's: no parents, or as many as tokens)."""
    tokens = draft.tokens
    parents = getattr(draft, "parents", None) or []
    is_path = getattr(draft, "is_path", None)  # a suffixcache Draft knows (and caches) it
    path = len(parents) != len(tokens) or (
        is_path() if is_path is not None else all(p == i - 1 for i, p in enumerate(parents))
    )
    return accepted_length(tokens, None if path else parents, appended)


class Drafting:
    def __init__(
        self,
        cache: SuffixCache,
        cache_config: CacheConfig,
        registry: SessionRegistry,
        counters: Counters,
        trees: TreeIndex,
        namespaces: NamespaceLimit,
    ) -> None:
        from suffixcache import CostProfile, DraftConfig, Drafter

        self.namespaces = namespaces
        self.cache = cache
        self.cache_config = cache_config
        self.registry = registry
        self.validator = registry.validator
        self.counters = counters
        self.trees = trees
        self._CostProfile = CostProfile
        self._DraftConfig = DraftConfig
        self._Drafter = Drafter
        self.drafter: Any = Drafter(
            cache,
            config=DraftConfig(max_tokens=cache_config.default_draft_tokens),
            cost_profile=CostProfile.cpu_default(),
        )
        # Called as fn(event, **fields) for "speculate" (ns, seconds, draft) and "step" (ns,
        # session, source, proposed, accepted); Engine.observers is this list.
        self.observers: list[Any] = []
        # Drafters for per-request cost profiles, keyed by the profile's JSON (LRU).
        self._drafters: OrderedDict[str, Any] = OrderedDict()
        self._drafters_lock = threading.Lock()

    def drafter_for(self, cost_profile: Any) -> Any:
        """The Drafter for a cost profile (None: the daemon's); InvalidArgument if bad."""
        if cost_profile is None:
            return self.drafter
        key = json.dumps(cost_profile, sort_keys=True) if not isinstance(cost_profile, str) \
            else cost_profile
        with self._drafters_lock:
            d = self._drafters.get(key)
            if d is not None:
                self._drafters.move_to_end(key)
                return d
        try:
            profile = self._CostProfile.from_json(cost_profile)
        except Exception as exc:
            raise InvalidArgument(f"invalid cost profile: {exc}") from None
        d = self._Drafter(
            self.cache,
            config=self._DraftConfig(max_tokens=self.cache_config.default_draft_tokens),
            cost_profile=profile,
        )
        with self._drafters_lock:
            self._drafters[key] = d
            while len(self._drafters) > 16:
                self._drafters.popitem(last=False)
        return d

    def propose(
        self,
        ns: str,
        session_id: str | None = None,
        context: Sequence[int] | None = None,
        max_tokens: int | None = None,
        cost_profile: Any = None,
        *,
        remember: bool = True,
    ) -> Any:
        self.validator.check_name("namespace", ns)
        sess = self.registry.get(ns, session_id) if session_id else None
        if sess is None:
            # Its counters would be the namespace's first state (the probe's flood).
            self.namespaces.admit(ns)
        if context is None:
            if sess is None:
                raise InvalidArgument("give a context or a session")
            ctx: Sequence[int] = sess.tail[-TAIL_KEEP:]
        else:
            ctx = self.validator.check_tokens(context, "context tokens")
        self.validator.check_max_tokens(max_tokens)
        return self.draft(ns, session_id or None, sess, ctx, max_tokens,
                          self.drafter_for(cost_profile), remember)

    def draft(
        self,
        ns: str,
        session_id: str | None,
        sess: Session | None,
        ctx: Sequence[int],
        max_tokens: int | None,
        drafter: Any,
        remember: bool,
    ) -> Any:
        t0 = time.perf_counter()
        try:
            draft = drafter.propose(ns, session_id or None, ctx, max_tokens or None)
        except KeyError:
            # The session was closed (or is still being opened) by a concurrent call.
            raise NotFound(f"no open session {session_id!r} in namespace {ns!r}") from None
        if self.observers:
            self._notify("speculate", ns=ns, seconds=time.perf_counter() - t0, draft=draft)
        if sess is not None:
            sess.last = time.time()
            if remember:
                sess.last_draft = draft
        self.counters.bump(ns, session_id or "", "speculate_calls", 1)
        return draft

    def record_step(
        self,
        ns: str,
        session_id: str | None,
        source: str,
        proposed: int,
        accepted: int,
        draft: Any = None,
        accepted_tokens: Sequence[int] | None = None,
    ) -> None:
        """Count one verified step: a draft of ``proposed`` tokens, ``accepted`` of them.

        With ``draft`` (a suffixcache Draft) the drafter's calibration learns from the
        outcome; ``accepted_tokens`` (the tokens that followed) locates the accepted
        branch of a tree draft.
        """
        if source not in SOURCES:
            source = "none"
        # Empty drafts too: the drafter's achieved rate must count the steps it
        # declined (one token at the cost of one), or it overrates what it achieves
        # and drafts too little.
        if isinstance(draft, Draft) and source != "draft_model":
            # Calibration is advisory; a failure there must not fail an append.
            with contextlib.suppress(Exception):
                self.drafter.observe(draft, accepted, accepted_tokens)
        sid = session_id or ""
        self.counters.count_step(ns, sid, source, proposed, accepted)
        if self.observers:
            self._notify("step", ns=ns, session=sid, source=source, proposed=proposed,
                         accepted=accepted)
        doc = self.trees.document_of(ns, draft) if draft is not None and accepted else None
        if doc is not None:
            self.counters.count_document_accept(ns, doc, accepted)

    def _notify(self, event: str, **fields: Any) -> None:
        for fn in self.observers:
            try:
                fn(event, **fields)
            except Exception:  # an observer must never fail a request
                log.exception("observer failed")
