"""Fleet replication on in-process engines (real LMDB, real redis-server): idempotence,
the bounded outbox, convergence of concurrent document writes, restart positions."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from suffixd.client.launch import free_port

from tests.test_fleet import RedisServer, wait_for

pytestmark = pytest.mark.needs_binary("redis-server", install="apt-get install redis-server; "
                                      ".ci/run installs it")


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    r = RedisServer(tmp_path / "redis").start()
    yield r
    r.stop()


class Node:
    def __init__(self, path: Path, url: str, node: str, **cfg: Any) -> None:
        from suffixd.daemon.engine import Engine
        from suffixd.daemon.fleet.config import FleetConfig
        from suffixd.daemon.fleet.node import Fleet

        self.path, self.url, self.node, self.cfg = path, url, node, cfg
        self.engine = Engine(path, vocab_size=70_000)
        self.fleet = Fleet(self.engine, FleetConfig(url, node, heartbeat_s=0.2, **cfg))
        self.fleet.start()

    def close(self) -> None:
        self.engine.close()

    def respond(self, sid: str, tokens: list[int], ns: str = "ns") -> None:
        e = self.engine
        if not any(s["session_id"] == sid for s in e.list_sessions(ns)):
            e.open_session(ns, sid, tokens=[1])
        e.append(ns, sid, "response", tokens)

    def global_tree(self, ns: str = "ns") -> dict[str, Any]:
        return dict(self.engine.stats(ns)[ns]["cache"].get("global", {}))

    def doc(self, key: str, ns: str = "ns") -> list[list[int]] | None:
        rec = self.engine.corpus_document(ns, key)
        if rec is None:
            return None
        return [self.engine.store.get_sequence(s)["tokens"] for s in rec["seqs"]]


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[Node]]:
    made: list[Node] = []
    yield made
    for n in made:
        n.close()


def _resp(i: int) -> list[int]:
    return [(i * 10 + k) % 60_000 + 2 for k in range(10)]


def test_an_entry_applied_twice_changes_nothing(redis_server: RedisServer, nodes: list[Node],
                                                tmp_path: Path) -> None:
    a = Node(tmp_path / "a", redis_server.url, "a")
    b = Node(tmp_path / "b", redis_server.url, "b")
    nodes += [a, b]
    a.respond("s", _resp(1))
    a.engine.add_corpus_document("ns", "d", [[5, 6, 7, 8]])
    wait_for(lambda: b.global_tree().get("sequences") == 1 and b.doc("d"), what="b applying")
    before = (b.global_tree(), b.doc("d"), b.engine.store.stat()["sequences"])
    r = redis_server.client()
    key = next(iter(r.keys("suffixd:*:log:ns")))
    entries = r.xrange(key)
    assert len(entries) == 2
    # The same stream entries again (a consumer replaying its position) ...
    b.fleet._consume([(key, entries)])
    # ... and re-published copies under new ids without an outbox number (an overflow
    # re-publish): both change nothing.
    import msgpack

    for _sid, fields in entries:
        e = msgpack.unpackb(fields[b"d"], raw=False)
        e["n"] = 0
        r.xadd(key, {"d": msgpack.packb(e, use_bin_type=True)})
    wait_for(lambda: b.fleet.pos["ns"] == r.xrevrange(key, count=1)[0][0].decode(),
             what="b reading the copies")
    assert (b.global_tree(), b.doc("d"), b.engine.store.stat()["sequences"]) == before
    assert b.fleet.applied == 2


def test_restarted_node_resumes_after_its_stored_position(redis_server: RedisServer,
                                                          nodes: list[Node],
                                                          tmp_path: Path) -> None:
    a = Node(tmp_path / "a", redis_server.url, "a")
    b = Node(tmp_path / "b", redis_server.url, "b")
    nodes.append(a)
    for i in range(5):
        a.respond("s", _resp(i))
    wait_for(lambda: b.global_tree().get("sequences") == 5, what="b applying")
    b.close()
    for i in range(5, 8):
        a.respond("s", _resp(i))
    b = Node(tmp_path / "b", redis_server.url, "b")
    nodes.append(b)
    wait_for(lambda: b.global_tree() == a.global_tree(), what="b catching up")
    assert b.fleet.applied == 3 and b.global_tree()["sequences"] == 8


def test_outbox_is_bounded_and_republished_when_redis_comes(nodes: list[Node],
                                                            tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    a = Node(tmp_path / "a", url, "a", max_backlog=5)
    nodes.append(a)
    for i in range(12):
        a.respond("s", _resp(i))
    a.engine.add_corpus_document("ns", "d", [[5, 6, 7, 8]])
    assert a.fleet.local_status()["backlog"] == 5
    assert not a.fleet.redis_up and a.fleet.last_error
    # Drafting goes on from the local trees.
    assert list(a.engine.propose("ns", None, _resp(3)[:3], 7).tokens) == _resp(3)[3:10]
    r = RedisServer(tmp_path / "redis", port=port).start()
    try:
        b = Node(tmp_path / "b", url, "b")
        nodes.append(b)
        wait_for(lambda: b.global_tree() == a.global_tree() and b.doc("d") == [[5, 6, 7, 8]],
                 timeout=30, what="b receiving the re-published namespace")
        assert a.engine.store.fleet_get(b"x:overflow") is None
        assert b.global_tree()["sequences"] == 12
    finally:
        for n in nodes:
            n.close()
        nodes.clear()
        r.stop()


def test_concurrent_writes_of_one_document_converge(redis_server: RedisServer,
                                                    nodes: list[Node],
                                                    tmp_path: Path) -> None:
    a = Node(tmp_path / "a", redis_server.url, "a")
    b = Node(tmp_path / "b", redis_server.url, "b")
    c = Node(tmp_path / "c", redis_server.url, "c")
    nodes += [a, b, c]
    a.respond("s", _resp(0))  # the namespace exists for everyone
    wait_for(lambda: c.global_tree().get("sequences") == 1, what="the namespace")
    for round_ in range(4):
        key = f"doc{round_}"
        a.engine.add_corpus_document("ns", key, [[100 + round_, 1, 2]])
        b.engine.add_corpus_document("ns", key, [[200 + round_, 3, 4]])
        if round_ % 2:
            a.engine.remove_corpus_document("ns", key)
        time.sleep(0.01)
    for round_ in range(4):
        key = f"doc{round_}"
        wait_for(lambda k=key: a.doc(k) == b.doc(k) == c.doc(k), timeout=30,
                 what=f"{key} converging")
