"""A fleet of real suffixd daemons replicating through a real redis-server.

The redis-server is started by the fixture on a free loopback port without persistence
(``.ci/run`` installs it); without the binary these tests are skipped, saying so.
Daemons run with ``--model none`` (token ids) except where a tokenizer is needed
(corpus warming); no model generation.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from suffixd.client import launch

from .conftest import dies_with_parent

pytestmark = pytest.mark.needs_binary("redis-server", install="apt-get install redis-server; "
                                      ".ci/run installs it")


class RedisServer(launch.RedisServer):
    """suffixd.client.launch's, ended with the test process (``dies_with_parent``)."""

    def launch_command(self) -> list[str]:
        return dies_with_parent(self.command())


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    r = RedisServer(tmp_path / "redis").start()
    yield r
    r.stop()


def fleet_args(r: RedisServer, node: str, *extra: str, model: str = "none") -> list[str]:
    return ["--model", model, "--fleet", r.url, "--node-id", node, *extra]


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def fleet_status(client: Any) -> dict[str, Any]:
    return json.loads(client.stats()["fleet_json"] or "{}")


def global_tree(client: Any, ns: str) -> dict[str, Any]:
    for e in client.stats(namespace=ns)["namespaces"]:
        if e["namespace"] == ns:
            return dict(e["global"])
    return {}


def drafted(client: Any, ns: str, context: list[int], n: int = 8) -> list[int]:
    return list(client.speculate(ns, None, context, n).tokens)


def test_response_on_a_is_drafted_on_b_and_c(daemon_factory: Any,
                                             redis_server: RedisServer) -> None:
    nodes = [daemon_factory(args=fleet_args(redis_server, n, "--metrics-addr", "127.0.0.1:0"))
             for n in "abc"]
    a, b, c = (n.client() for n in nodes)
    resp = list(range(100, 140))
    with a.session("agents") as s:
        s.append([1, 2, 3])
        s.append(resp, kind="response")
    for other in (b, c):
        got = wait_for(lambda o=other: drafted(o, "agents", resp[:10]) or None,
                       what="the response on a peer")
        assert got == resp[10:10 + len(got)] and len(got) >= 4
    # Namespaces stay isolated: another namespace drafts nothing from it.
    assert drafted(b, "other", resp[:10]) == []
    # Session trees stay local: a's open session is not on b.
    assert b.list_sessions("agents") == []
    st = wait_for(lambda: (fs := fleet_status(b)) and len(fs.get("nodes", {})) == 3 and fs,
                  what="three heartbeats")
    assert st["node"]["applied"] >= 1 and st["node"]["redis_up"]
    assert set(st["nodes"]) == {"a", "b", "c"}
    assert fleet_status(a)["node"]["published"] >= 1
    # Prometheus: the fleet's gauges.
    addr = (nodes[1].data_dir / "metrics.addr").read_text().strip()

    def metrics() -> str:
        with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as page:
            return str(page.read().decode())

    # The lag (summed over namespaces: none is named without --metrics-namespaces) comes
    # with the next heartbeat.
    text = wait_for(lambda: (t := metrics()) and 'suffixd_fleet_lag_entries{namespace="all"}'
                    in t and t, what="the lag gauge")
    assert "suffixd_fleet_backlog 0.0" in text and "suffixd_fleet_redis_up 1.0" in text
    # The CLI: this node's line, and every node with --fleet.
    out = subprocess.run([sys.executable, "-m", "suffixd.cli.main", "stats", "--data-dir",
                          str(nodes[1].data_dir), "--fleet"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[3:] if line}
    assert set(rows) == {"a", "b", "c"}, out.stdout
    assert all(r[1] == "up" for r in rows.values()), out.stdout
    assert "as node b: redis up" in out.stdout
    plain = subprocess.run([sys.executable, "-m", "suffixd.cli.main", "stats", "--data-dir",
                            str(nodes[1].data_dir)], capture_output=True, text=True, timeout=60)
    assert plain.returncode == 0 and "backlog 0" in plain.stdout, plain.stdout + plain.stderr
    for cl in (a, b, c):
        cl.close()


def test_corpus_file_warmed_on_a_changed_and_deleted_is_followed_by_b(
        daemon_factory: Any, redis_server: RedisServer, tmp_path: Path) -> None:
    na = daemon_factory(args=fleet_args(redis_server, "a", model="default"))
    nb = daemon_factory(args=fleet_args(redis_server, "b", model="default"))
    a, b = na.client(), nb.client()
    corpus = tmp_path / "sql"
    corpus.mkdir()
    f = corpus / "q.sql"

    def warm() -> None:
        out = subprocess.run([sys.executable, "-m", "suffixd.cli.main", "warm", "--corpus",
                              str(corpus), "--namespace", "sql", "--data-dir",
                              str(na.data_dir), "--no-progress"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr

    def corpus_on_b() -> int:
        for e in b.stats(namespace="sql")["namespaces"]:
            return int(e["corpus"].get("sequences", 0) or e["corpus"].get("count", 0))
        return 0

    v1 = "SELECT name, price FROM products WHERE category = 'garden tools' ORDER BY price;"
    f.write_text(v1 + "\n")
    warm()
    ctx1 = b.tokenize("SELECT name, price FROM products WHERE")
    rest1 = b.tokenize(v1)[len(ctx1):]
    got = wait_for(lambda: drafted(b, "sql", ctx1, 6) or None, what="the document on b")
    assert got == rest1[:len(got)]

    v2 = "UPDATE inventory SET quantity = quantity - 1 WHERE sku = 'umbrella-large';"
    assert rest1[:3] != b.tokenize(" sku = 'umbrella")[:3]
    f.write_text(v2 + "\n")
    warm()
    ctx2 = b.tokenize("UPDATE inventory SET quantity")
    got = wait_for(lambda: drafted(b, "sql", ctx2, 6) or None, what="the new version on b")
    assert got == b.tokenize(v2)[len(ctx2):][:len(got)]
    # The old version's continuation is gone (" WHERE" may now continue as in v2).
    wait_for(lambda: drafted(b, "sql", ctx1, 6)[:3] != rest1[:3],
             what="the old version gone on b")

    f.unlink()
    warm()
    wait_for(lambda: corpus_on_b() == 0 and drafted(b, "sql", ctx2, 6) == [],
             what="the deleted file gone on b")
    a.close()
    b.close()


def _ingest(client: Any, ns: str, n: int, start: int, stop: threading.Event | None = None,
            pause: float = 0.0) -> int:
    """n responses of 12 distinct tokens each; returns how many were acknowledged."""
    done = 0
    with client.session(ns) as s:
        for i in range(start, start + n):
            if stop is not None and stop.is_set():
                break
            s.append([7, (i * 13) % 50000 + 1], kind="prompt")
            s.append([(i * 12 + k) % 60000 + 1 for k in range(12)], kind="response")
            done += 1
            if pause:
                time.sleep(pause)
    return done


def test_peer_killed_9_while_a_ingests_catches_up_nothing_lost_or_doubled(
        daemon_factory: Any, redis_server: RedisServer) -> None:
    na = daemon_factory(args=fleet_args(redis_server, "a"))
    nb = daemon_factory(args=fleet_args(redis_server, "b"))
    a, b = na.client(), nb.client()
    res: dict[str, int] = {}
    t = threading.Thread(target=lambda: res.setdefault("n", _ingest(a, "load", 300, 0,
                                                                     pause=0.002)))
    t.start()
    wait_for(lambda: global_tree(b, "load").get("sequences", 0) >= 20, what="b applying")
    b.close()
    nb.kill9()
    time.sleep(0.3)
    nb.start()
    t.join(60)
    assert res["n"] == 300
    b = nb.client()
    want = global_tree(a, "load")
    assert want["sequences"] == 300 and want["tokens"] == 300 * 12
    wait_for(lambda: global_tree(b, "load") == want, what="b caught up exactly")
    # Every response drafts on b.
    for i in (0, 150, 299):
        seq = [(i * 12 + k) % 60000 + 1 for k in range(12)]
        assert drafted(b, "load", seq[:4], 8) == seq[4:12]
    a.close()
    b.close()


def test_redis_stopped_and_restarted_under_load(daemon_factory: Any,
                                                redis_server: RedisServer) -> None:
    na = daemon_factory(args=fleet_args(redis_server, "a"))
    nb = daemon_factory(args=fleet_args(redis_server, "b"))
    a, b = na.client(), nb.client()
    _ingest(a, "rs", 20, 0)
    wait_for(lambda: global_tree(b, "rs").get("sequences") == 20, what="b following")
    redis_server.stop()
    # a keeps serving from its own trees and buffers what it must publish.
    assert _ingest(a, "rs", 40, 1000) == 40
    seq = [(1010 * 12 + k) % 60000 + 1 for k in range(12)]
    assert drafted(a, "rs", seq[:4], 8) == seq[4:12]
    st = wait_for(lambda: (fs := fleet_status(a)["node"]) and not fs["redis_up"]
                  and fs["backlog"] > 0 and fs, what="a reporting the outage")
    assert st["backlog"] == 40 and st["error"]
    redis_server.start()
    _ingest(a, "rs", 10, 2000)
    want = global_tree(a, "rs")
    assert want["sequences"] == 70
    wait_for(lambda: global_tree(b, "rs") == want, timeout=30, what="b after the outage")
    assert wait_for(lambda: fleet_status(a)["node"]["backlog"] == 0, what="backlog drained")
    a.close()
    b.close()


def test_new_node_catches_up_from_a_snapshot_after_the_stream_was_trimmed(
        daemon_factory: Any, redis_server: RedisServer) -> None:
    na = daemon_factory(args=fleet_args(redis_server, "a", "--fleet-max-entries", "20"))
    a = na.client()
    _ingest(a, "snap", 60, 0)
    r = redis_server.client()
    keys = [k for k in r.keys("suffixd:*:log:snap")]
    assert len(keys) == 1
    wait_for(lambda: r.xlen(keys[0]) < 60 and fleet_status(a)["node"]["snapshots_written"],
             what="a trimming the stream")
    nc = daemon_factory(args=fleet_args(redis_server, "c"))
    c = nc.client()
    want = global_tree(a, "snap")
    wait_for(lambda: global_tree(c, "snap") == want, what="c caught up from the snapshot")
    assert fleet_status(c)["node"]["snapshots_loaded"] >= 1
    a.close()
    c.close()


def test_a_node_with_another_tokenizer_refuses_to_join(daemon_factory: Any,
                                                       redis_server: RedisServer) -> None:
    redis_server.client().hset("suffixd:fleet", "tokenizer", "gguf:some-other-model")
    d = daemon_factory(args=fleet_args(redis_server, "x"), expect_ready=False)
    assert d.wait(60) == 2
    log = d.log()
    assert "uses tokenizer gguf:some-other-model" in log, log
    assert "joins only a fleet of its own tokenizer" in log and "Traceback" not in log


def test_credentials_come_from_the_url_or_env_and_never_reach_logs_or_status(
        daemon_factory: Any, redis_server: RedisServer) -> None:
    secret = "s3cret-fleet-pw"
    redis_server.client().config_set("requirepass", secret)
    url = f"redis://:{secret}@127.0.0.1:{redis_server.port}/0"
    na = daemon_factory(args=["--model", "none", "--fleet", url, "--node-id", "a"])
    nb = daemon_factory(args=fleet_args(redis_server, "b"),
                        env={"SUFFIXD_REDIS_PASSWORD": secret})
    a, b = na.client(), nb.client()
    _ingest(a, "pw", 3, 0)
    wait_for(lambda: global_tree(b, "pw").get("sequences") == 3, what="b via the env password")
    st = fleet_status(a)["node"]
    assert st["url"] == f"redis://***@127.0.0.1:{redis_server.port}/0"
    a.close()
    b.close()
    na.stop()
    nb.stop()
    for d in (na, nb):
        assert secret not in d.log()


def test_redact() -> None:
    from suffixd.daemon.fleet.config import redact

    assert redact("rediss://user:pw@h:6380/1?ssl_cert_reqs=none") == "rediss://***@h:6380/1"
    assert redact("redis://h:6379/0") == "redis://h:6379/0"
