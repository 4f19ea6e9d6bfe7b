"""A namespace dropped on one node is dropped on every node, and stays dropped (issue 27):
neither a lagging node's entry written before the drop nor a snapshot taken before it
brings it back; a node away while the drop passed drops it on its return.

Real daemons and a real redis-server (the drop's path through the CLI); the crafted
stale snapshot on in-process engines."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from suffixcache.store_layout import pack_tokens
from tests.test_fleet import (
    RedisServer,
    fleet_args,
    fleet_status,
    global_tree,
    wait_for,
)
from tests.test_fleet_engine import Node

pytestmark = pytest.mark.needs_binary("redis-server", install="apt-get install redis-server; "
                                      ".ci/run installs it")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    r = RedisServer(tmp_path / "redis").start()
    yield r
    r.stop()


def _toks(i: int) -> list[int]:
    return [(i * 37 + k * 11) % 60_000 + 5 for k in range(12)]


def _respond(client: Any, ns: str, items: range) -> None:
    with client.session(ns) as s:
        for i in items:
            s.append([1, 2], kind="prompt")
            s.append(_toks(i), kind="response")


def _stale_entry(r: Any, ns: str, i: int, n: int, ep: int = 0) -> None:
    """What a lagging node publishes late: a response written before the drop."""
    key = next(iter(r.keys(f"suffixd:*:log:{ns}")))
    r.xadd(key, {"d": msgpack.packb({"op": "resp", "ns": ns, "src": "late.1", "n": n,
                                     "t": time.time(), "ep": ep, "o": f"late.1:{i}",
                                     "tok": pack_tokens(_toks(i))}, use_bin_type=True)})


def _drafts(client: Any, ns: str, i: int) -> bool:
    t = _toks(i)
    return list(client.speculate(ns, None, t[:4], 8).tokens) == t[4:12]


def test_a_drop_on_one_node_drops_the_namespace_everywhere_for_good(
        daemon_factory: Any, redis_server: RedisServer) -> None:
    na = daemon_factory(args=fleet_args(redis_server, "a", "--fleet-max-entries", "6"))
    nb = daemon_factory(args=fleet_args(redis_server, "b"))
    nc = daemon_factory(args=fleet_args(redis_server, "c"))
    a, b, c = na.client(), nb.client(), nc.client()
    _respond(a, "gone", range(3))
    _respond(a, "kept", range(100, 102))
    for cl in (b, c):
        wait_for(lambda cl=cl: global_tree(cl, "gone").get("sequences") == 3
                 and global_tree(cl, "kept").get("sequences") == 2, what="3 + 2 everywhere")
    c.close()
    nc.stop()  # c is away while the drop passes

    out = subprocess.run([sys.executable, "-m", "suffixd.cli.main", "namespaces", "drop",
                          "gone", "--yes", "--data-dir", str(nb.data_dir)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "dropped gone: 0 open sessions, 3 sequences" in out.stdout, out.stdout
    assert "published to the fleet: every node drops the namespace" in out.stdout
    wait_for(lambda: not global_tree(a, "gone").get("sequences"), what="the drop on a")
    assert not any(_drafts(cl, "gone", i) for cl in (a, b) for i in range(3))
    assert global_tree(a, "kept").get("sequences") == 2  # other namespaces untouched

    # A lagging node's entry from before the drop, then new data after it: only the new.
    r = redis_server.client()
    _stale_entry(r, "gone", 50, 1)
    _respond(a, "gone", range(10, 17))  # the stream passes 6 entries: a snapshots, trims
    for cl in (a, b):
        wait_for(lambda cl=cl: global_tree(cl, "gone").get("sequences") == 7,
                 what="the 7 after the drop")
        assert all(_drafts(cl, "gone", i) for i in range(10, 17))
        assert not _drafts(cl, "gone", 50) and not _drafts(cl, "gone", 0)
    wait_for(lambda: fleet_status(a)["node"]["snapshots_written"] >= 1, what="a trimming")
    # An invalid entry on the way is skipped and counted where operators look.
    r.xadd(next(iter(r.keys("suffixd:*:log:gone"))), {"d": b"\x00"})
    _respond(a, "gone", range(17, 18))
    wait_for(lambda: global_tree(b, "gone").get("sequences") == 8, what="b past it")
    out = subprocess.run([sys.executable, "-m", "suffixd.cli.main", "stats", "--data-dir",
                          str(nb.data_dir), "--fleet"], capture_output=True, text=True,
                         timeout=60)
    assert "invalid entries skipped: gone unreadable 1" in out.stdout, out.stdout + out.stderr

    # c comes back below the trim point: the snapshot is after the drop, so c drops too.
    nc.start()
    c = nc.client()
    want = global_tree(a, "gone")
    wait_for(lambda: global_tree(c, "gone") == want, what="c dropping and catching up")
    assert not _drafts(c, "gone", 0) and _drafts(c, "gone", 12)
    assert global_tree(c, "kept").get("sequences") == 2

    # b restarted: the drop and its epoch are stored; the stale entry is not applied now
    # either (published again after the restart).
    b.close()
    nb.stop()
    nb.start()
    b = nb.client()
    _stale_entry(r, "gone", 51, 2)
    _respond(a, "gone", range(20, 21))
    wait_for(lambda: global_tree(b, "gone").get("sequences") == 9, what="b after restart")
    assert not _drafts(b, "gone", 51) and not _drafts(b, "gone", 1)
    for cl in (a, b, c):
        cl.close()
    for d in (na, nb, nc):
        d.stop()
        assert "Traceback" not in d.log() and "failed; retrying" not in d.log(), d.log()


@pytest.fixture
def nodes() -> Iterator[list[Node]]:
    made: list[Node] = []
    yield made
    for n in made:
        n.close()


def _resp(node: Node, i: int, ns: str = "ns") -> None:
    node.respond(f"s{i}", _toks(i), ns)


def _has(node: Node, i: int, ns: str = "ns") -> bool:
    t = _toks(i)
    return list(node.engine.propose(ns, None, t[:4], 8).tokens) == t[4:12]


def test_a_snapshot_from_before_a_drop_does_not_bring_the_namespace_back(
        redis_server: RedisServer, nodes: list[Node], tmp_path: Path) -> None:
    a = Node(tmp_path / "a", redis_server.url, "a")
    b = Node(tmp_path / "b", redis_server.url, "b")
    nodes += [a, b]
    _resp(a, 1)
    wait_for(lambda: _has(b, 1), what="b has 1")
    a.engine.drop_namespace("ns")
    wait_for(lambda: not _has(b, 1), what="the drop on b")
    b.close()
    nodes.remove(b)
    # A snapshot of the namespace as it was before the drop (epoch 0), trimmed past b's
    # position: what a node that took it before the drop would have left.
    r = redis_server.client()
    key = a.fleet.keys.stream("ns")
    stale_pos = r.xadd(key, {b"x": b"padding"}).decode()
    r.rpush(a.fleet.keys.snap("ns"), msgpack.packb(
        [["r", "old.1:4", pack_tokens(_toks(4))]], use_bin_type=True))
    r.hset(a.fleet.keys.snapmeta("ns"), mapping={"pos": stale_pos, "trimmed": stale_pos,
                                                 "node": "old.1", "ep": 0})
    b = Node(tmp_path / "b", redis_server.url, "b")
    nodes.append(b)
    wait_for(lambda: b.fleet.pos.get("ns") == stale_pos, what="b past the snapshot")
    assert b.fleet.snapshots_loaded == 0  # skipped whole: older than the drop
    _resp(a, 2)
    wait_for(lambda: _has(b, 2), what="b reading on")
    assert not _has(b, 4) and not _has(b, 1)
    # A new node joins at that snapshot (epoch 0: it takes the old response), then reads
    # a's response of epoch 1 after it, the proof of the drop: the old one goes.
    c = Node(tmp_path / "c", redis_server.url, "c")
    nodes.append(c)
    wait_for(lambda: _has(c, 2), what="c caught up")
    assert c.fleet.snapshots_loaded == 1
    assert not _has(c, 4) and not _has(c, 1)


def test_an_entry_whose_epoch_proves_a_missed_drop_drops_first(
        redis_server: RedisServer, nodes: list[Node], tmp_path: Path) -> None:
    b = Node(tmp_path / "b", redis_server.url, "b")
    nodes.append(b)
    _resp(b, 1)
    r = redis_server.client()
    key = b.fleet.keys.stream("ns")
    wait_for(lambda: r.exists(key), what="b's stream")
    # A peer's response of epoch 1: the namespace was dropped and this came after; b
    # never read that drop (its entry trimmed away, or dropped from a full outbox).
    r.xadd(key, {"d": msgpack.packb({"op": "resp", "ns": "ns", "src": "p.1", "n": 1,
                                     "t": time.time(), "ep": 1, "o": "p.1:9",
                                     "tok": pack_tokens(_toks(9))}, use_bin_type=True)})
    wait_for(lambda: _has(b, 9), what="b applying the entry")
    assert not _has(b, 1)
    from suffixd.daemon.fleet import outbox

    assert outbox.epoch(b.engine.store, "ns") == 1
