"""Dropping a namespace: everything in it, durably, in one LMDB transaction.

``drop_namespace(parts, ns)`` (Engine.drop_namespace, the DropNamespace RPC, `suffixd
namespaces drop NAME`): its open sessions are closed (their responses dropped, not kept),
then one transaction deletes every record of the namespace (sessions and their chunks,
global and corpus sequences, corpus file records, counters: Txn.drop_namespace), then the
in-memory state follows (trees, counters, budgets, the namespace's place under
--max-namespaces). Durable when it returns; a background rebuild still running does not
put the sequences back. In a fleet the drop is published in the same transaction (the
fleet's ingest hook, op "drop"), and a peer's drop is applied here with ``replica`` (the
hook records its epoch and position instead of publishing it again).

Locks: the namespace's session locks, taken in sorted order (as ingest takes them), are
held across the transaction, so no append of those sessions interleaves; their queued
deferred writes are committed first (a write queued behind the drop would bring a
dropped session's records back).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .session_state import end_batch

if TYPE_CHECKING:
    from suffixcache import SuffixCache
    from suffixcache.store import Store

    from .budgets import NamespaceLimit, SessionBudgets
    from .counters import Counters
    from .ingest import Ingest
    from .session_state import SessionRegistry
    from .trees import TreeIndex


@dataclass
class NamespaceParts:
    store: Store
    cache: SuffixCache
    registry: SessionRegistry
    counters: Counters
    trees: TreeIndex
    ingest: Ingest
    budgets: SessionBudgets
    namespaces: NamespaceLimit
    publish: Callable[..., None]


def drop_namespace(p: NamespaceParts, ns: str, replica: Any = None) -> dict[str, Any]:
    p.registry.validator.check_name("namespace", ns)
    sessions = sorted(p.registry.sessions(ns), key=lambda s: s.id)
    with contextlib.ExitStack() as stack:
        for s in sessions:
            stack.enter_context(s.lock)
            end_batch(s)
        for s in sessions:
            with contextlib.suppress(Exception):  # a failed one: its records go anyway
                p.ingest.wait_commits(s)

        def write(t: Any) -> dict[str, Any]:
            dropped: dict[str, Any] = t.drop_namespace(ns)
            p.publish(t, "drop", ns, replica=replica)
            # In the transaction: a counter flush queued after it must not write them back.
            dropped["counters"] = p.counters.forget_namespace(ns)
            return dropped

        dropped = p.store.write(write)
        for s in sessions:
            s.closed = True
            p.registry.remove(s.ns, s.id)
            p.budgets.dropped(s.ns, s.id)
    p.trees.forget_namespace(ns, dropped["sequence_ids"])
    had_trees = p.cache.drop_namespace(ns)
    p.namespaces.forget(ns)
    found = bool(sessions or had_trees or dropped["counters"] or dropped["records"])
    return {"found": found, "sessions": len(sessions),
            "sequences": len(dropped["sequence_ids"]), "documents": dropped["documents"]}
