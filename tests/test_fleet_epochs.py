"""Fleet drop epochs cannot be forged into a split (issue 33, item 2).

Anyone with write access to Redis can put an entry with any drop epoch into a
namespace's stream. Before the fix an entry of epoch 2**63-1 made every node drop the
namespace, the next ordinary drop published 2**63 (which every node, the publisher
included, refused as out of range), and from then on the nodes ignored each other's
entries for that namespace for good.

Now a drop moves the epoch forward by a bounded step over the stream's epoch (what every
node has read at the same position, so every node judges an entry alike); an entry
beyond it is invalid: skipped and counted like the other malformed entries.

The property test runs a reference model of nodes (their local epochs and contents, the
outboxes, the shared stream) through the consumer's own epoch rules
(``entries.epoch_error`` / ``entries.epoch_action``); the daemon test is the probe's
attack on real daemons and a real redis-server.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from suffixd.daemon.fleet import entries

from suffixcache.store_layout import pack_tokens
from tests.test_fleet import RedisServer, fleet_args, fleet_status, global_tree, wait_for
from tests.test_fleet_drop import _respond, _toks

# ---------------------------------------------------------------- the reference model


@dataclass
class _Entry:
    op: str  # "resp" | "drop"
    ep: int
    src: str
    item: int = -1  # a response's identity


@dataclass
class _Node:
    name: str
    ep: int = 0  # the namespace's local drop epoch
    sep: int = 0  # the stream's epoch at this node's position
    pos: int = 0  # entries of the stream handled
    items: set[int] = field(default_factory=set)
    outbox: list[_Entry] = field(default_factory=list)
    invalid: int = 0

    def write(self, item: int) -> _Entry:
        self.items.add(item)
        self.outbox.append(_Entry("resp", self.ep, self.name, item))
        return self.outbox[-1]

    def drop(self) -> None:
        # What FleetPublisher._hook does for a local drop: the next epoch, published.
        self.ep += 1
        assert self.ep < entries.MAX_EPOCH, "a legitimate drop must always be publishable"
        self.items.clear()
        self.outbox.append(_Entry("drop", self.ep, self.name))

    def consume(self, stream: list[_Entry]) -> None:
        # FleetConsumer._parse / _consume_namespace, on the model's state.
        e = stream[self.pos]
        self.pos += 1
        if entries.epoch_error(e.ep, self.sep) is not None:
            self.invalid += 1
            return
        self.sep = max(self.sep, e.ep)
        drop_first, apply = entries.epoch_action(e.op, e.ep, self.ep)
        if drop_first:
            self.ep = e.ep
            self.items.clear()
        if apply and e.src != self.name:
            self.items.add(e.item)


_FORGED = st.builds(
    _Entry, op=st.sampled_from(["resp", "drop"]),
    ep=st.one_of(st.integers(0, 8), st.integers(0, 2**63 - 1),
                 st.sampled_from([2**63 - 1, 2**62, entries.MAX_EPOCH_STEP,
                                  entries.MAX_EPOCH_STEP + 1])),
    src=st.just("forger"))

# (kind, node index, payload): a local write, a local drop, a node publishing its next
# outbox entry, a node reading its next stream entry, a forged entry.
_STEP = st.one_of(
    st.tuples(st.just("write"), st.integers(0, 2), st.none()),
    st.tuples(st.just("drop"), st.integers(0, 2), st.none()),
    st.tuples(st.just("publish"), st.integers(0, 2), st.none()),
    st.tuples(st.just("consume"), st.integers(0, 2), st.none()),
    st.tuples(st.just("forge"), st.just(0), _FORGED),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_STEP, max_size=60))
def test_forged_epochs_never_leave_two_nodes_disagreeing(steps: list[Any]) -> None:
    nodes = [_Node(f"n{i}") for i in range(3)]
    stream: list[_Entry] = []
    written_at: dict[int, int] = {}  # item -> the epoch it was written in
    for kind, i, payload in steps:
        n = nodes[i]
        if kind == "write":
            written_at[len(written_at)] = n.write(len(written_at)).ep
        elif kind == "drop":
            n.drop()
        elif kind == "publish" and n.outbox:
            stream.append(n.outbox.pop(0))
        elif kind == "consume" and n.pos < len(stream):
            n.consume(stream)
        elif kind == "forge":
            payload.item = -1 - len(written_at)
            stream.append(payload)
            written_at[payload.item] = payload.ep
    # A legitimate drop after whatever came before, then the streams consumed: one state.
    nodes[0].drop()
    last = nodes[0].ep
    for n in nodes:
        stream.extend(n.outbox)
        n.outbox.clear()
    for n in nodes:
        while n.pos < len(stream):
            n.consume(stream)
    assert len({(n.ep, frozenset(n.items)) for n in nodes}) == 1, nodes
    assert len({n.invalid for n in nodes}) == 1  # every node judged every entry alike
    # The last drop is everywhere: what is left was written in its epoch (after it, or
    # after a drop of the same epoch on another node: one drop).
    assert nodes[1].ep >= last
    assert all(written_at[i] == nodes[1].ep for i in nodes[1].items), nodes
    # ...and the namespace works afterwards: a drop, then a write on another node,
    # reaches every node.
    nodes[2].drop()
    nodes[1].write(10**6)
    for n in (nodes[2], nodes[1]):
        stream.extend(n.outbox)
        n.outbox.clear()
    for n in nodes:
        while n.pos < len(stream):
            n.consume(stream)
    assert len({(n.ep, frozenset(n.items)) for n in nodes}) == 1, nodes


def test_the_epoch_rules() -> None:
    assert entries.epoch_error(1, 0) is None
    assert entries.epoch_error(entries.MAX_EPOCH_STEP, 0) is None
    assert entries.epoch_error(entries.MAX_EPOCH_STEP + 1, 0) is not None
    assert entries.epoch_error(2**63 - 1, 5) is not None
    assert entries.epoch_error(0, 2**40) is None  # an old entry: skipped, not invalid
    assert entries.epoch_action("drop", 3, 3) == (False, False)  # applied already
    assert entries.epoch_action("resp", 2, 3) == (False, False)  # before a drop
    assert entries.epoch_action("resp", 3, 3) == (False, True)
    assert entries.epoch_action("resp", 4, 3) == (True, True)  # proves a missed drop
    assert entries.epoch_action("drop", 4, 3) == (True, False)


# ---------------------------------------------------------------- the real daemons

pytestmark_redis = pytest.mark.needs_binary(
    "redis-server", install="apt-get install redis-server; .ci/run installs it")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    r = RedisServer(tmp_path / "redis").start()
    yield r
    r.stop()


def _drafts(client: Any, ns: str, i: int) -> bool:
    t = _toks(i)
    return list(client.speculate(ns, None, t[:4], 8).tokens) == t[4:12]


def _forge(r: Any, ns: str, n: int, **f: Any) -> None:
    key = next(iter(r.keys(f"suffixd:*:log:{ns}")))
    r.xadd(key, {"d": msgpack.packb({"ns": ns, "src": "evil.1", "n": n, "t": time.time(),
                                     **f}, use_bin_type=True)})


@pytestmark_redis
def test_a_forged_drop_epoch_neither_wipes_nor_splits_the_namespace(
        daemon_factory: Any, redis_server: RedisServer) -> None:
    na = daemon_factory(args=fleet_args(redis_server, "a"))
    nb = daemon_factory(args=fleet_args(redis_server, "b"))
    a, b = na.client(), nb.client()
    _respond(a, "ns", range(2))
    _respond(b, "ns", range(2, 4))
    for cl in (a, b):
        wait_for(lambda cl=cl: global_tree(cl, "ns").get("sequences") == 4,
                 what="4 responses on both")

    # The probe's entry, and a response whose absurd epoch would "prove" a missed drop.
    r = redis_server.client()
    _forge(r, "ns", 1, op="drop", ep=2**63 - 1)
    _forge(r, "ns", 2, op="resp", ep=2**62, o="evil.1:1", tok=pack_tokens(_toks(99)))
    _respond(a, "ns", range(4, 5))
    for cl in (a, b):
        wait_for(lambda cl=cl: global_tree(cl, "ns").get("sequences") == 5,
                 what="the namespace kept, a's response after the forged entries applied")
        assert not _drafts(cl, "ns", 99)
        wait_for(lambda cl=cl: fleet_status(cl)["node"]["invalid_entries"].get("ns")
                 == {"epoch": 2}, what="the forged entries counted as invalid")

    # An ordinary drop is published and applied everywhere; then the nodes follow each
    # other again (before the fix: published as 2**63, refused by every node).
    out = subprocess.run([sys.executable, "-m", "suffixd.cli.main", "namespaces", "drop",
                          "ns", "--yes", "--data-dir", str(nb.data_dir)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    wait_for(lambda: not global_tree(a, "ns").get("sequences"), what="the drop on a")
    _respond(a, "ns", range(10, 12))
    _respond(b, "ns", range(12, 14))
    for cl in (a, b):
        wait_for(lambda cl=cl: global_tree(cl, "ns").get("sequences") == 4,
                 what="both nodes following each other after the drop")
        assert all(_drafts(cl, "ns", i) for i in range(10, 14))
        assert not any(_drafts(cl, "ns", i) for i in range(5))
    for cl in (a, b):
        cl.close()
    for d in (na, nb):
        d.stop()
        assert "Traceback" not in d.log() and "failed; retrying" not in d.log(), d.log()


@pytestmark_redis
def test_a_snapshot_with_a_forged_epoch_is_skipped_and_counted(
        redis_server: RedisServer, tmp_path: Path) -> None:
    from suffixd.daemon.fleet import outbox

    from tests.test_fleet_engine import Node

    made: list[Node] = []
    try:
        a = Node(tmp_path / "a", redis_server.url, "a")
        made.append(a)
        a.respond("s1", _toks(1))
        r = redis_server.client()
        key = a.fleet.keys.stream("ns")
        wait_for(lambda: r.exists(key), what="a's stream")
        # A snapshot trimmed past every position whose epoch would wipe the namespace on
        # the node loading it and leave it deaf to its peers.
        pos = r.xadd(key, {b"x": b"padding"}).decode()
        r.rpush(a.fleet.keys.snap("ns"), msgpack.packb(
            [["r", "old.1:4", pack_tokens(_toks(4))]], use_bin_type=True))
        r.hset(a.fleet.keys.snapmeta("ns"), mapping={"pos": pos, "trimmed": pos,
                                                     "node": "old.1", "ep": 2**63 - 1})
        c = Node(tmp_path / "c", redis_server.url, "c")
        made.append(c)
        wait_for(lambda: c.fleet.pos.get("ns") == pos, what="c past the snapshot")
        assert c.fleet.local_status()["invalid_entries"] == {"ns": {"epoch": 1}}
        assert c.fleet.snapshots_loaded == 0 and outbox.epoch(c.engine.store, "ns") == 0
        a.respond("s2", _toks(2))  # epoch 0: c follows a
        wait_for(lambda: c.global_tree().get("sequences") == 1, what="c reading on")
    finally:
        for n in made:
            n.close()
