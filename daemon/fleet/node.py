"""A fleet of suffixd nodes whose global and corpus trees follow one log in Redis Streams.

``suffixd serve --fleet redis://host:6379/0 --node-id a`` on every node. Redis is the only
shared part; this module speaks to it with the ``redis`` client (no protocol of our own).

Publishing (transactional outbox). Every ingest that reaches a namespace's global or
corpus tree calls ``Engine.ingest_hook`` inside its LMDB transaction: a finished response
("resp"), a corpus document added or replaced ("doc") or removed ("undoc"), sequences
evicted by the budget or dropped with a closed session ("evict"), a namespace dropped
("drop"). The hook writes the
entry into the ``fleet`` database's outbox in that same transaction, so an entry exists
exactly when its data committed. A publisher thread XADDs the outbox, in order, to the
namespace's stream and then deletes what it published. While Redis is away the outbox
grows up to ``max_backlog`` entries (durable across restarts); past that the oldest are
dropped and the namespace is marked, and once Redis is back the node re-publishes its
own responses and its documents of that namespace (evictions in the dropped part are
lost: the peers evict by their own budgets).

Consuming. A consumer thread XREADs every namespace's stream after its position and
applies the other nodes' entries to its own trees and LMDB. The position (the stream id
of the last entry handled) is written in the same transaction as the entry's data, so a
node killed at any point resumes exactly after what it applied: nothing lost or doubled.
A second guard makes re-published entries harmless: each entry carries its origin's
(``src``) outbox number, and a node skips numbers it already handled; responses are
keyed by origin (``src:seq``), documents compared by content digest.

Documents converge to the last entry of the stream: a node also re-applies its own doc
entry when a peer's entry for that document was applied after its local write (it skips
its own entries older than its latest write of that document).

Checking. Redis is shared, so nothing read from it is trusted: every entry (and every
snapshot item) is checked whole before anything of it is stored (daemon/fleet/entries.py:
the op's fields, the namespace, token ids inside the vocabulary, the sizes the daemon
allows its own inputs). An invalid one is skipped, logged once with its stream id and
counted by namespace and reason (``status()["invalid_entries"]``,
``suffixd_fleet_invalid_entries_total``); the position moves past it and the valid
entries around it are applied. A namespace name that is not one (bad UTF-8, too long)
is never read, and a stream key holding another type is set aside for 30 s at a time,
so one bad key does not stop the other namespaces.

Drops. ``Engine.drop_namespace`` calls the hook (op "drop") in its transaction: the
namespace's drop epoch (stored in the ``fleet`` database, 0 until a first drop) goes up
by one and a "drop" entry carrying it is queued. Every entry is stamped with the epoch of
the namespace when its data was written, and every snapshot with the epoch of its
writer. Epochs read from Redis are checked first (daemon/fleet/entries.py): an entry may
move the epoch at most ``MAX_EPOCH_STEP`` past the stream's epoch at its position (the
highest epoch of the valid entries before it, kept with the position: every node judges
an entry alike), so a forged epoch is an invalid entry, and a legitimate drop always has
an epoch left. A node applies a drop of a higher epoch as a local drop (without publishing it
again) in the transaction that records the new epoch and its position; it ignores entries
and snapshots of a lower epoch (written before a drop it applied: a lagging node's entry
cannot bring the namespace back); an entry or snapshot of a higher epoch proves a drop
it never read (trimmed away, or lost from a full outbox), so it drops first. The
consumer holds ``apply_lock`` while it checks and applies a namespace's entries and a
local drop takes it too (``Engine.fleet_lock``), so no entry checked against the old
epoch is written after a drop. Two nodes that drop at once both reach the same epoch:
one drop.

Trimming and snapshots. A stream longer than ``max_entries`` is trimmed by one node (a
Redis lock) that is caught up: it first stores a snapshot of the namespace as it holds
it at its position P (every response with its origin, every document) under the
namespace's snapshot key, then records ``trimmed = P`` and trims the stream to the
entries from P on (XTRIM MINID), atomically. A node whose position is below ``trimmed``
(joined late, or away too long) loads that snapshot (adds the responses it lacks, drops
replicated ones absent from it, applies documents whose content differs), sets its
position to P and reads on from there. (A document removed in the fleet while such a
node was away stays on it until removed again: the snapshot lists what exists, and the
node cannot tell a peer's removal from a document of its own not yet published.)

Identity and isolation. Keys are ``<prefix>:<tokenizer tag>:...``, one stream per
namespace. ``<prefix>:fleet`` records the fleet's tokenizer fingerprint: a node with
another tokenizer refuses to join. Credentials and TLS come from the URL (``rediss://``,
``redis://:password@host``) or ``$SUFFIXD_REDIS_PASSWORD``; the URL is logged redacted.

Status. Nodes heartbeat their lag, backlog and counts into ``<prefix>:<tag>:nodes``;
``status()`` (the Stats RPC, ``suffixd stats [--fleet]``) and the Prometheus collector
report them.

Where it lives. ``Fleet`` (here) holds one node's identity, its Redis connection and the
threads; its rooms are mixins over that shared state: daemon/fleet/publish.py (the ingest
hook and the publisher thread), daemon/fleet/consume.py (the consumer thread and the
appliers), daemon/fleet/snapshot.py (trim and catch-up), daemon/fleet/status.py (the
heartbeat, status and metrics). daemon/fleet/outbox.py is the LMDB state and the entry
format, daemon/fleet/config.py the configuration and the Redis key names.

Interface: ``Fleet(engine, FleetConfig(url, node_id, ...), client=None)`` (installs
itself as ``engine.fleet`` and ``engine.ingest_hook``), ``start()``, ``close()``,
``status()``, ``local_status()``, ``collector()``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import threading
from collections import OrderedDict, deque
from typing import Any

from . import outbox
from .config import FleetConfig, FleetError, RedisKeys, connect, redact
from .consume import FleetConsumer
from .publish import FleetPublisher
from .snapshot import FleetSnapshots
from .status import FleetStatusView

log = logging.getLogger("suffixd.fleet")

_NODE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class Fleet(FleetPublisher, FleetConsumer, FleetSnapshots, FleetStatusView):
    """One node's replication: see the module docstring."""

    def __init__(self, engine: Any, cfg: FleetConfig, client: Any = None) -> None:
        import redis

        if not _NODE_RE.match(cfg.node_id or ""):
            raise FleetError("--node-id must be 1-64 characters of A-Z a-z 0-9 _ . -")
        self.engine = engine
        self.store = engine.store
        self.cfg = cfg
        self.node = cfg.node_id
        self.url_shown = redact(cfg.url)
        self._redis_mod = redis
        self.r = client if client is not None else connect(cfg, self.url_shown)
        if engine.fingerprint:
            self.tokenizer = str(engine.fingerprint)
        elif engine.vocab_size:
            self.tokenizer = f"token-ids:vocab={engine.vocab_size}"
        else:
            self.tokenizer = "token-ids"
        tag = hashlib.sha256(self.tokenizer.encode()).hexdigest()[:12]
        self.keys = RedisKeys(cfg.prefix, f"{cfg.prefix}:{tag}")
        # Origins name the data directory too: a node whose data was wiped starts a new
        # numbering, and its old entries are then the peers' data to catch up from.
        self.src = f"{self.node}.{outbox.incarnation(self.store)}"
        self.pos: dict[str, str] = outbox.read_positions(self.store)
        self.sep: dict[str, int] = outbox.read_stream_epochs(self.store)
        self.seen: dict[tuple[str, str], int] = outbox.read_seen(self.store)
        self._dirty_pos: set[str] = set()
        self.namespaces: set[str] = set()
        self.joined = False
        self.refused: str | None = None
        self.redis_up = False
        self.last_error = ""
        self.published = 0
        self.applied = 0
        self.skipped = 0
        self.invalid: dict[tuple[str, str], int] = {}  # (namespace, reason) -> entries
        self._invalid_seen: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._bad_names: set[bytes] = set()
        self._bad_streams: dict[str, float] = {}  # namespace -> when its key was not a stream
        # The consumer holds it while it applies a namespace's entries; a local drop
        # (Engine.drop_namespace) takes it too, so the two never interleave.
        self.apply_lock = threading.RLock()
        engine.fleet_lock = self.apply_lock
        self.snapshots_loaded = 0
        self.snapshots_written = 0
        self.backlog = outbox.backlog(self.store)
        self.lag: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, Any] = {}
        self._apply_lat: deque[float] = deque(maxlen=4096)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        engine.ingest_hook = self._hook
        engine.fleet = self

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Join (refusing another tokenizer if Redis answers now) and start the threads.
        An unreachable Redis is not an error: the node serves and retries."""
        try:
            self._join()
        except self._redis_mod.RedisError as exc:
            self._down(exc)
            log.warning("fleet: Redis unreachable; serving from the local trees and "
                        "buffering until it answers",
                        extra={"url": self.url_shown, "error": self.last_error})
        for fn, name in ((self._publish_loop, "suffixd-fleet-publish"),
                         (self._consume_loop, "suffixd-fleet-consume")):
            t = threading.Thread(target=fn, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self.engine.close_hooks.append(self.close)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()
        with contextlib.suppress(Exception):
            self.r.close()

    # ------------------------------------------------------------------ the connection
    def _join(self) -> None:
        key = self.keys.fleet
        self.r.hsetnx(key, "tokenizer", self.tokenizer)
        theirs = self.r.hget(key, "tokenizer")
        theirs_s = theirs.decode() if theirs is not None else self.tokenizer
        if theirs_s != self.tokenizer:
            self.refused = (
                f"the fleet at {self.url_shown} (key prefix {self.cfg.prefix!r}) uses "
                f"tokenizer {theirs_s}, but this node's model has {self.tokenizer}: a node "
                "joins only a fleet of its own tokenizer (use the same model, or another "
                "Redis database or --fleet-prefix)"
            )
            self._stop.set()
            raise FleetError(self.refused)
        if not self.joined:
            log.info("fleet: joined", extra={"url": self.url_shown, "node": self.src,
                                             "tokenizer": self.tokenizer})
        self.joined = True
        self._up()

    def _up(self) -> None:
        if not self.redis_up:
            self.redis_up = True
            self.last_error = ""

    def _down(self, exc: BaseException) -> None:
        msg = f"{type(exc).__name__}: {exc}".replace(self.cfg.url, self.url_shown)
        if self.redis_up or not self.last_error:
            log.warning("fleet: Redis unreachable", extra={"url": self.url_shown,
                                                           "error": msg})
        self.redis_up = False
        self.last_error = msg
