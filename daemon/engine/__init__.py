"""The daemon's state, without gRPC or a model: ``Engine`` (facade.py) over the suffix
trees (``suffixcache``) and the LMDB store. What it offers the rest is the Engine's
Python API (facade.py's docstring); its modules, bottom-up:

* ``validation`` (names, tokens, kinds), ``trees`` (the start-up rebuild, removals);
* ``session_state``: an open session's state, the registry, a queued deferred write;
* ``counters``, ``budgets`` (namespaces let in, session tree sizes);
* ``drafting`` (proposals, step feedback), ``ingest`` (durable and deferred appends);
* ``sessions`` (open, close, idle expiry), ``corpus_docs``, ``namespace_drop``;
* ``facade``: ``Engine``, which builds the parts and forwards their calls.
"""

from .facade import KINDS, SOURCES, AppendResult, Engine

__all__ = ["KINDS", "SOURCES", "AppendResult", "Engine"]
