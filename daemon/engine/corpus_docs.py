"""Corpus documents added through the engine: a document is stored as sequences of the
namespace's corpus tree, under a key (replacing an older version of it).

Interface (``CorpusDocuments``, one per Engine):

* ``add(ns, doc_key, sequences, content_hash, meta, replica)`` -> the new sequence ids;
* ``remove(ns, doc_key, replica)`` -> whether it existed;
* ``get(ns, doc_key)`` (the stored record: sequence ids, hash, meta, tokens, time) and
  ``documents(ns)``.

``replica``: the fleet applies a peer's entry, which is not published again.

Durability: ``add`` and ``remove`` return once the document record, its sequences (old ones
deleted) and the fleet's outbox entry are committed in one transaction; the corpus tree
follows after. No lock of its own: the store serialises writes, the trees go through
``TreeIndex`` (which keeps a background rebuild from resurrecting replaced sequences).
The warm path (``grpc_api/corpus_service.py``) stores files with its own records on the same trees.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from suffixcache.store import Store, Txn

from ..common.errors import InvalidArgument, ResourceExhausted
from .trees import TreeIndex
from .validation import Validator

if TYPE_CHECKING:
    from .budgets import NamespaceLimit


class CorpusDocuments:
    def __init__(self, store: Store, validator: Validator, trees: TreeIndex,
                 publish: Callable[..., None], namespaces: NamespaceLimit) -> None:
        self.namespaces = namespaces
        self.store = store
        self.validator = validator
        self.limits = validator.limits
        self.trees = trees
        self.publish = publish

    def add(
        self,
        ns: str,
        doc_key: str,
        sequences: Sequence[Sequence[int]],
        *,
        content_hash: str | None = None,
        meta: dict[str, Any] | None = None,
        replica: Any = None,
    ) -> list[int]:
        self.validator.check_name("namespace", ns)
        if not doc_key or "\x00" in doc_key:
            raise InvalidArgument("doc_key must be a non-empty string without NUL")
        seqs = [self.validator.check_tokens(s) for s in sequences]
        if sum(map(len, seqs)) > self.limits.max_tokens_per_call:
            raise ResourceExhausted(
                f"more than {self.limits.max_tokens_per_call} tokens in one document"
            )
        if replica is None:  # a fleet peer's document is applied whatever the limit
            self.namespaces.admit(ns)
        old: list[int] = []

        def write(t: Txn) -> list[int]:
            old.clear()
            prev = t.get_doc(ns, doc_key)
            if prev is not None:
                old.extend(prev.get("seqs", []))
                for s in old:
                    t.delete_sequence(s)
            ids = [t.add_sequence(ns, "corpus", s, doc=doc_key) for s in seqs if s]
            t.put_doc(ns, doc_key, {"seqs": ids, "hash": content_hash, "meta": meta or {},
                                    "tokens": sum(map(len, seqs)), "t": time.time()})
            self.publish(t, "doc", ns, key=doc_key, seqs=seqs, hash=content_hash,
                         meta=meta or {}, replica=replica)
            return ids

        ids: list[int] = self.store.write(write)
        self.trees.remove(ns, "corpus", old)
        for seq, toks in zip(ids, [s for s in seqs if s], strict=True):
            self.trees.add_corpus(ns, seq, toks, doc_key)
        return ids

    def remove(self, ns: str, doc_key: str, replica: Any = None) -> bool:
        self.validator.check_name("namespace", ns)
        old: list[int] = []

        def write(t: Txn) -> bool:
            old.clear()
            prev = t.get_doc(ns, doc_key)
            if prev is None:
                return False
            old.extend(prev.get("seqs", []))
            for s in old:
                t.delete_sequence(s)
            t.delete_doc(ns, doc_key)
            self.publish(t, "undoc", ns, key=doc_key, replica=replica)
            return True

        found: bool = self.store.write(write)
        self.trees.remove(ns, "corpus", old)
        return found

    def get(self, ns: str, doc_key: str) -> dict[str, Any] | None:
        return self.store.get_doc(ns, doc_key)

    def documents(self, ns: str | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        return self.store.iter_docs(ns)
