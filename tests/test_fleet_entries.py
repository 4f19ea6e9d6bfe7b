"""Bad fleet entries (issue 27): whatever is in a namespace's Redis stream, a node skips
what it cannot apply, counts it, moves past it and applies the rest; a store that holds
a record no tree takes (committed by an older version) still rebuilds.

In-process engines with a real LMDB and a real redis-server; the rebuild through the real
daemon too (`--rebuild background` and `blocking`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffixcache.store_layout import pack_tokens
from tests.test_fleet import RedisServer, wait_for
from tests.test_fleet_engine import Node

pytestmark = pytest.mark.needs_binary("redis-server", install="apt-get install redis-server; "
                                      ".ci/run installs it")

BAD_TOKENS = [2**31 - 1, -5, 999_999_999]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    r = RedisServer(tmp_path / "redis").start()
    yield r
    r.stop()


@pytest.fixture
def node_b(redis_server: RedisServer, tmp_path: Path,
           caplog: pytest.LogCaptureFixture) -> Iterator[Node]:
    b = Node(tmp_path / "b", redis_server.url, "b")
    yield b
    b.close()
    # Whatever was in the stream, the consumer never failed ("applying entries failed;
    # retrying") and Redis never looked unreachable.
    bad = [r.getMessage() for r in caplog.records
           if r.name == "suffixd.fleet" and (r.levelname == "ERROR" or "unreachable"
                                             in r.getMessage())]
    assert not bad, bad


def _entry(ns: str, src: str, **f: Any) -> dict[bytes, bytes]:
    return {b"d": msgpack.packb({"ns": ns, "src": src, "n": 0, "t": time.time(), **f},
                                use_bin_type=True)}


def _resp(ns: str, src: str, i: int, toks: list[int]) -> dict[bytes, bytes]:
    return _entry(ns, src, op="resp", o=f"{src}:{i}", tok=pack_tokens(toks))


def _toks(i: int, salt: int = 0) -> list[int]:
    return [(salt * 997 + i * 31 + k * 7) % 60_000 + 3 for k in range(12)]


def _publish(r: Any, node: Node, ns: str, entries: list[dict[bytes, bytes]]) -> str:
    """XADD the entries in one pipeline (one XREAD batch); the last stream id."""
    key = node.fleet.keys.stream(ns)
    pipe = r.pipeline(transaction=False)
    for fields in entries:
        pipe.xadd(key, fields)
    pipe.sadd(node.fleet.keys.namespaces, ns)
    ids = pipe.execute()
    return str(ids[-2].decode())


def _drafts(node: Node, ns: str, toks: list[int]) -> bool:
    return list(node.engine.propose(ns, None, toks[:4], 8).tokens) == toks[4:12]


def test_a_response_without_its_origin_is_skipped_and_replication_goes_on(
        redis_server: RedisServer, node_b: Node) -> None:
    r = redis_server.client()
    good = [_toks(i) for i in range(3)]
    last = _publish(r, node_b, "ns", [
        _resp("ns", "p.1", 0, good[0]),
        _entry("ns", "p.1", op="resp", tok=pack_tokens(_toks(9))),  # no "o"
        _resp("ns", "p.1", 1, good[1]),
    ])
    wait_for(lambda: node_b.fleet.pos.get("ns") == last, what="b past the bad entry")
    _publish(r, node_b, "ns", [_resp("ns", "p.1", 2, good[2])])
    wait_for(lambda: node_b.global_tree().get("sequences") == 3, what="the later entry")
    assert all(_drafts(node_b, "ns", t) for t in good)
    st_ = node_b.fleet.local_status()
    assert st_["invalid"] == 1 and st_["invalid_entries"] == {"ns": {"schema": 1}}


def test_out_of_range_tokens_are_refused_and_the_rest_of_the_batch_applied(
        redis_server: RedisServer, node_b: Node, tmp_path: Path) -> None:
    r = redis_server.client()
    good = [_toks(i) for i in range(4)]
    last = _publish(r, node_b, "ns", [
        _resp("ns", "p.1", 0, good[0]),
        _resp("ns", "p.1", 1, good[1]),
        _resp("ns", "p.1", 2, BAD_TOKENS),
        _resp("ns", "p.1", 3, good[2]),
        _resp("ns", "p.1", 4, [5, 6, 70_000]),  # the vocabulary of b is 70,000
        _resp("ns", "p.1", 5, good[3]),
    ])
    wait_for(lambda: node_b.fleet.pos.get("ns") == last, what="b past the batch")
    wait_for(lambda: node_b.global_tree().get("sequences") == 4, what="the valid four")
    assert all(_drafts(node_b, "ns", t) for t in good)
    assert node_b.fleet.local_status()["invalid_entries"] == {"ns": {"tokens": 2}}
    # Nothing of them was committed: the store holds the four, and rebuilds them.
    assert node_b.engine.store.stat()["sequences"] == 4
    node_b.close()
    b2 = Node(tmp_path / "b", redis_server.url, "b")
    try:
        assert not b2.engine.rebuilding and b2.engine.trees.invalid_records == 0
        assert all(_drafts(b2, "ns", t) for t in good)
    finally:
        b2.close()


def test_stats_fleet_and_metrics_count_invalid_entries(redis_server: RedisServer,
                                                       node_b: Node) -> None:
    from prometheus_client import generate_latest
    from suffixd.cli.stats import render_fleet
    from suffixd.daemon.server.metrics import build_registry

    r = redis_server.client()
    last = _publish(r, node_b, "ns", [{b"x": b"y"}, {b"d": b"\xc1\xc1"},
                                      _resp("ns", "p.1", 0, _toks(0))])
    wait_for(lambda: node_b.fleet.pos.get("ns") == last, what="b past the entries")
    text = generate_latest(build_registry(node_b.engine, namespaces=True)).decode()
    assert 'suffixd_fleet_invalid_entries_total{namespace="ns",reason="unreadable"} 2.0' \
        in text, text
    hidden = generate_latest(build_registry(node_b.engine)).decode()
    assert 'suffixd_fleet_invalid_entries_total{namespace="all",reason="unreadable"} 2.0' \
        in hidden
    out = render_fleet(node_b.fleet.status())
    assert "invalid entries skipped: ns unreadable 2" in out, out


# ------------------------------------------------------------------ property
_FIELDS = ("op", "ns", "src", "n", "t", "o", "tok", "key", "seqs", "hash", "meta", "ep")
_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**63, max_value=2**64 - 1),
                     st.floats(), st.text(max_size=20), st.binary(max_size=24))
_values = st.recursive(_scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                     st.dictionaries(st.text(max_size=6), c,
                                                                     max_size=4)),
                       max_leaves=12)
# Near an entry: the schema's own field names, any values, but no drop: a well-formed
# "drop", or any entry whose epoch "ep" is past the node's (the proof of a drop it never
# read), rightly takes the namespace's earlier entries with it.
_not_an_epoch = _values.filter(lambda v: isinstance(v, bool) or not isinstance(v, int) or v < 1)
_near = st.fixed_dictionaries(
    {"op": st.sampled_from(["resp", "doc", "undoc", "evict", "bogus"]) | _values},
    optional={f: (_not_an_epoch if f == "ep" else _values) for f in _FIELDS if f != "op"})
_garbage = st.one_of(
    st.dictionaries(st.binary(min_size=1, max_size=8), st.binary(max_size=64), min_size=1,
                    max_size=3),
    st.binary(max_size=64).map(lambda b: {b"d": b}),
    _values.map(lambda v: {b"d": msgpack.packb(v, use_bin_type=True)}),
    _near.map(lambda v: {b"d": msgpack.packb(v, use_bin_type=True)}),
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=st.lists(st.one_of(st.just(None), _garbage), min_size=1, max_size=12))
def test_arbitrary_entries_never_stop_the_valid_ones(redis_server: RedisServer,
                                                     node_b: Node, plan: list[Any]) -> None:
    r = redis_server.client()
    ns = f"p{uuid.uuid4().hex[:10]}"
    src = f"v{uuid.uuid4().hex[:10]}"  # no generated entry names these origins
    salt = int(uuid.uuid4().int % 1000)
    good: list[list[int]] = []
    entries: list[dict[bytes, bytes]] = []
    for item in plan:
        if item is None:
            good.append(_toks(len(good), salt))
            entries.append(_resp(ns, src, len(good), good[-1]))
        else:
            entries.append(item)
    good.append(_toks(len(good), salt))  # at least one valid one, last
    entries.append(_resp(ns, src, len(good), good[-1]))
    last = _publish(r, node_b, ns, entries)
    wait_for(lambda: node_b.fleet.pos.get(ns) == last, timeout=30, what="b past the entries")
    assert all(_drafts(node_b, ns, t) for t in good)
    assert all(t.is_alive() for t in node_b.fleet._threads)


# ------------------------------------------------------------------ rebuild
def _store_with_a_bad_record(path: Path, vocab_size: int | None) -> list[list[int]]:
    """A data directory as the version that committed a peer's entry unchecked left it:
    a valid response, the bad one, another valid one."""
    from suffixd.daemon.engine import Engine

    good = [_toks(1), _toks(2)]
    with Engine(path, vocab_size=vocab_size) as e:
        e.open_session("ns", "s", tokens=[1])
        e.append("ns", "s", "response", good[0])
        e.store.write(lambda t: t.add_sequence("ns", "response", BAD_TOKENS,
                                               meta={"origin": "x.1:7"}))
        e.append("ns", "s", "response", good[1])
    return good


@pytest.mark.parametrize("background", [True, False])
def test_a_store_holding_an_invalid_record_rebuilds(tmp_path: Path, background: bool) -> None:
    from suffixd.daemon.engine import Engine

    good = _store_with_a_bad_record(tmp_path / "d", 70_000)
    with Engine(tmp_path / "d", vocab_size=70_000, background_rebuild=background) as e:
        wait_for(lambda: not e.rebuilding, timeout=20, what="the rebuild's end")
        assert e.trees.invalid_records == 1
        for t in good:
            assert list(e.propose("ns", None, t[:4], 8).tokens) == t[4:12]


@pytest.mark.parametrize("mode", ["background", "blocking"])
def test_the_daemon_starts_and_rebuilds_past_an_invalid_record(daemon_factory: Any,
                                                               tmp_path: Path,
                                                               mode: str) -> None:
    data = tmp_path / "data"
    good = _store_with_a_bad_record(data, None)
    d = daemon_factory(data, args=["--model", "none", "--rebuild", mode])
    c = d.client(wait_rebuilt=False)
    wait_for(lambda: not c.info().get("rebuilding"), timeout=30, what="Info.rebuilding false")
    for t in good:
        assert list(c.speculate("ns", None, t[:4], 8).tokens) == t[4:12]
    c.close()
    d.stop()
    log = d.log()
    assert "Traceback" not in log and "skipped a stored sequence no tree takes" in log, log


def test_entries_the_store_would_refuse_are_refused_before_it(redis_server: RedisServer,
                                                              node_b: Node) -> None:
    """A document key too long for an LMDB key, metadata past its limits: refused as
    entries (a write LMDB refused would be retried for ever)."""
    r = redis_server.client()
    doc = {"op": "doc", "seqs": [pack_tokens([5, 6, 7])], "hash": "h"}
    last = _publish(r, node_b, "ns", [
        _entry("ns", "p.1", key="k" * 600, **doc),
        _entry("ns", "p.1", key="big-meta", meta={f"m{i}": "x" for i in range(100)}, **doc),
        _entry("ns", "p.1", key="nested-meta", meta={"a": [1, {"b": 2}]}, **doc),
        _entry("ns", "p.1", key="fine", meta={"kind": "sql", "size": 12}, **doc),
    ])
    wait_for(lambda: node_b.fleet.pos.get("ns") == last, what="b past the entries")
    assert node_b.fleet.local_status()["invalid_entries"] == {"ns": {"size": 1, "schema": 2}}
    assert node_b.doc("fine") == [[5, 6, 7]]


def test_a_stream_key_of_another_type_does_not_stop_the_other_namespaces(
        redis_server: RedisServer, node_b: Node) -> None:
    r = redis_server.client()
    r.set(node_b.fleet.keys.stream("bad"), b"not a stream")
    r.sadd(node_b.fleet.keys.namespaces, "bad", b"\xff\xfe")  # and a name no node writes
    _publish(r, node_b, "ns", [_resp("ns", "p.1", 0, _toks(0))])
    wait_for(lambda: _drafts(node_b, "ns", _toks(0)), what="the good namespace applied")
    time.sleep(0.5)
    _publish(r, node_b, "ns", [_resp("ns", "p.1", 1, _toks(1))])
    wait_for(lambda: _drafts(node_b, "ns", _toks(1)), what="and on")
    assert node_b.fleet.redis_up
