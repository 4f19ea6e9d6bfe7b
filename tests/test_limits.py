"""Bounded state, through the real daemon: every path that creates per-namespace state
counts against the namespace limit, session trees have token and byte budgets, Stats is
paginated whatever the number of namespaces, a namespace can be dropped durably, and the
small ones (DescribeSession's tail, CloseSession's responses_kept)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
from suffixd.client import InvalidArgumentError, ResourceExhaustedError
from suffixd.client import requests as rq
from suffixd.client.errors import from_rpc_error
from suffixd.v1 import corpus_pb2, corpus_pb2_grpc

CTX = [11, 12, 13, 14, 15, 16]


def warm(client: Any, ns: str, path: str, units: list[str]) -> Any:
    stub = client.stub_for(corpus_pb2_grpc.CorpusStub)
    chunk = corpus_pb2.FileChunk(path=path, content_hash="h1", first=True, last=True,
                                 units=[corpus_pb2.CorpusUnit(segments=[u]) for u in units])
    try:
        return list(stub.WarmFiles(iter([corpus_pb2.WarmRequest(namespace=ns, chunks=[chunk])]),
                                   metadata=client.metadata))
    except grpc.RpcError as exc:
        raise from_rpc_error(exc) from None


def all_namespaces(client: Any, page_size: int = 0) -> list[str]:
    return [ns["namespace"] for ns in client.stats(top_documents=1,
                                                   page_size=page_size)["namespaces"]]


# --------------------------------------------------------------------------- namespaces


def test_every_path_that_creates_a_namespace_counts_against_the_limit(daemon_factory: Any
                                                                      ) -> None:
    proc = daemon_factory(args=["--max-namespaces", "20"])
    c = proc.client()
    refused = 0
    for i in range(60):  # the probe's flood: Speculate with a context, new namespaces
        try:
            c.speculate(f"flood{i:03}", None, CTX, 4)
        except ResourceExhaustedError as exc:
            assert "20 namespaces" in str(exc) and "--max-namespaces" in str(exc)
            refused += 1
    assert refused == 40
    assert len(all_namespaces(c)) == 20
    # the other ways in are refused too: a session, a corpus file
    with pytest.raises(ResourceExhaustedError, match="namespaces"):
        c.open_session("brand-new")
    with pytest.raises(ResourceExhaustedError, match="namespaces"):
        warm(c, "brand-new", "/a.sql", ["SELECT 1 ;"])
    # a namespace that exists goes on working
    c.speculate("flood000", None, CTX, 4)
    with c.session("flood001") as s:
        s.append(tokens=CTX, kind="prompt")
    # dropping one frees its place
    assert c.drop_namespace("flood005")["found"]
    c.open_session("brand-new", "kept-open")
    c.close()
    proc.stop()
    proc = daemon_factory(data_dir=proc.data_dir, args=["--max-namespaces", "20"])
    c = proc.client()
    names = all_namespaces(c)
    assert len(names) == 20 and "brand-new" in names and "flood005" not in names
    with pytest.raises(ResourceExhaustedError):
        c.speculate("flood999", None, CTX, 4)
    c.close()


def test_stats_is_paginated_under_a_flood_left_in_the_store(daemon_factory: Any,
                                                            tmp_path: Path) -> None:
    """80,000 namespaces of stored counters (what the unbounded versions left behind):
    Stats still answers, page by page, and after a restart; drop removes them."""
    from suffixcache.store import Store

    data = tmp_path / "flood"
    proc = daemon_factory(data_dir=data, args=["--model", "none"])
    proc.stop()
    store = Store(data / "store")
    n = 80_000

    def write(t: Any) -> None:
        for i in range(n):
            t.put_counters(f"ns{i:05}", "", {"speculate_calls": 1})

    store.write(write)
    store.close()
    proc = daemon_factory(data_dir=data, args=["--model", "none"])
    c = proc.client()
    first = c.call(c.stub.Stats, rq.stats_request(None, None, False, 1))
    assert first.namespaces_total == n and first.next_page_token
    assert len(first.namespaces) == 1000  # the default page
    assert first.ByteSize() < 16 << 20
    names = all_namespaces(c)
    assert len(names) == n and len(set(names)) == n and names == sorted(names)
    assert c.drop_namespace("ns00007")["found"]
    proc.stop()
    proc = daemon_factory(data_dir=data, args=["--model", "none"])
    c = proc.client()
    names = all_namespaces(c, page_size=5000)
    assert len(names) == n - 1 and "ns00007" not in names
    with pytest.raises(InvalidArgumentError, match="page_token"):
        c.call(c.stub.Stats, rq.stats_request(None, None, False, 1, 0, "garbage"))
    c.close()


def test_a_page_stops_at_half_the_message_limit(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--model", "none", "--max-message-bytes", str(16 << 10)])
    c = proc.client()
    for i in range(6):
        ns = f"wide{i}"
        for j in range(60):
            c.open_session(ns, f"a-session-with-a-rather-long-identifier-{j:04}")
    pages = []
    token = ""
    while True:
        page = c.call(c.stub.Stats, rq.stats_request(None, None, True, 1, 0, token))
        assert page.ByteSize() <= 8 << 10 or len(page.namespaces) == 1
        pages.append([ns.namespace for ns in page.namespaces])
        token = page.next_page_token
        if not token:
            break
    assert len(pages) > 1
    assert [n for p in pages for n in p] == [f"wide{i}" for i in range(6)]
    c.close()


def test_drop_namespace_is_durable_and_complete(daemon_factory: Any, tmp_path: Path) -> None:
    proc = daemon_factory()
    c = proc.client()
    ids = c.tokenize("SELECT name FROM singer WHERE age > 30 ;")
    for ns in ("doomed", "kept"):
        with c.session(ns, session_id="done") as s:
            s.append(tokens=ids, kind="prompt")
            s.speculate(max_tokens=4)
            s.append(tokens=ids, kind="response")
        c.open_session(ns, "open")
        c.append(ns, "open", ids, kind="prompt")
        warm(c, ns, "/q.sql", ["SELECT count(*) FROM concert ;", "SELECT 1 ;"])
    r = c.drop_namespace("doomed")
    assert r == {"found": True, "sessions": 1, "sequences": 3, "documents": 1}
    assert c.drop_namespace("doomed")["found"] is False

    def gone(client: Any) -> None:
        assert "doomed" not in all_namespaces(client)
        assert client.list_sessions("doomed") == []
        assert "kept" in all_namespaces(client)
        assert client.speculate("kept", None, ids[:4], 8).tokens  # untouched

    gone(c)
    c.close()
    proc.stop()
    proc = daemon_factory(data_dir=proc.data_dir)
    c = proc.client()
    gone(c)
    assert [s.session_id for s in c.list_sessions("kept")] == ["open"]
    # the command line
    out = subprocess.run([sys.executable, "-m", "suffixd.cli.main", "namespaces", "drop",
                          "kept", "--yes", "--data-dir", str(proc.data_dir)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "dropped kept: 1 open sessions, 3 sequences, 1 corpus files" in out.stdout
    assert all_namespaces(c) == []
    # nothing left to draft from (a Speculate there starts the namespace afresh)
    assert c.speculate("doomed", None, ids[:4], 8).tokens == []
    assert c.speculate("kept", None, ids[:4], 8).tokens == []
    c.close()


# --------------------------------------------------------------------------- sessions


def test_session_trees_have_token_and_byte_budgets(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--model", "none", "--max-session-tokens", "1000",
                                "--max-total-session-tokens", "2500"])
    c = proc.client()
    a = c.open_session("b", "a")
    c.append("b", a.session_id, list(range(1, 901)), kind="prompt")
    with pytest.raises(ResourceExhaustedError, match=r"limit per session is 1000 "
                                                     r"\(--max-session-tokens\)"):
        c.append("b", "a", list(range(1, 201)), kind="prompt")
    with pytest.raises(ResourceExhaustedError, match="--max-session-tokens"):
        c.open_session("b", "big", tokens=list(range(1, 1102)))
    assert c.describe_session("b", "a").tokens == 900  # the refused append left nothing
    c.open_session("b", "b", tokens=list(range(1, 901)))
    c.open_session("b", "c", tokens=list(range(1, 601)))
    with pytest.raises(ResourceExhaustedError, match=r"all sessions .* 2500 "
                                                     r"\(--max-total-session-tokens\)"):
        c.append("b", "c", list(range(1, 201)), kind="prompt")
    # the same through a stream step
    with pytest.raises(ResourceExhaustedError, match="--max-total-session-tokens"), \
            c.stepper("b", "c") as st:
        st.step(list(range(1, 201)))
    # closing a session gives its tokens back
    c.close_session("b", "b")
    c.append("b", "c", list(range(1, 201)), kind="prompt")
    st = c.stats()
    mem = {m["kind"]: m for m in st["memory"]}
    assert mem["session"]["tokens"] == 900 + 800
    assert mem["session"]["budget_tokens"] == 2500
    assert mem["session"]["budget_tokens_per_tree"] == 1000
    assert mem["global"]["budget_tokens_per_tree"] == 4_000_000
    assert mem["session"]["bytes"] > 0 and mem["session"]["trees"] == 2
    out = subprocess.run([sys.executable, "-m", "suffixd.cli.main", "stats", "--data-dir",
                          str(proc.data_dir)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "memory" in out.stdout and "2,500 tokens" in out.stdout
    c.close()


def test_session_bytes_budget(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--model", "none", "--max-session-bytes", "200000"])
    c = proc.client()
    c.open_session("m", "s")
    with pytest.raises(ResourceExhaustedError, match=r"\(--max-session-bytes\)"):
        for i in range(100):
            c.append("m", "s", [(i * 7919 + j * 104729) % 30000 + 1 for j in range(500)],
                     kind="tool")
    assert 0 < c.describe_session("m", "s").tokens < 50_000
    c.close()


# --------------------------------------------------------------------------- small ones


def test_describe_session_tail(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--model", "none", "--max-tokens-per-call", "5000"])
    c = proc.client()
    toks = list(range(1, 3001))
    with c.session("t", "s", tokens=toks) as s:
        assert s.describe().tail == []
        assert s.describe(tail_tokens=5).tail == toks[-5:]
        assert s.describe(tail_tokens=2500).tail == toks[-2500:]  # beyond the kept tail
        assert s.describe(tail_tokens=4000).tail == toks
        with pytest.raises(ResourceExhaustedError, match="tail_tokens 5001"):
            s.describe(tail_tokens=5001)
    c.close()


def test_close_session_reports_the_responses_still_in_the_global_tree(daemon_factory: Any
                                                                      ) -> None:
    proc = daemon_factory(args=["--model", "none", "--global-budget-tokens", "100"])
    c = proc.client()
    c.open_session("g", "s")
    for i in range(20):
        c.append("g", "s", [i + 1] * 10, kind="response")
    r = c.close_session("g", "s")
    in_tree = c.stats("g")["namespaces"][0]["global"]["sequences"]
    assert r["responses_kept"] == in_tree == 10
    c.close()
