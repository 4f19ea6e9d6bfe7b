"""Hypothesis fuzzing of the servicer, in-process: a real gRPC server (Unix socket) on a real
Engine (LMDB, embedded tokenizer). Hostile input must yield a clear client-side status, never
INTERNAL/UNKNOWN, never a dead server, never a lost acknowledged write."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from suffixd.daemon.common.config import Limits
from suffixd.daemon.engine import Engine
from suffixd.daemon.server.serve import build_server
from suffixd.daemon.server.serve_config import ServeConfig
from suffixd.v1 import suffixd_pb2 as pb
from suffixd.v1 import suffixd_pb2_grpc as pb_grpc

ALLOWED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
}

NAMES = ["fz", "fz2", ""]
SIDS = ["s0", "s1", "ghost", ""]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Engine]]:
    data = tmp_path_factory.mktemp("fuzz")
    limits = Limits(max_tokens_per_call=5000, max_sessions_per_namespace=20,
                    max_message_bytes=1 << 20, session_idle_timeout_s=0)
    engine = Engine(data, model_path="default", limits=limits)
    sock = Path(data) / "f.sock"
    cfg = ServeConfig(data_dir=data, listen=[f"unix:{sock}"], limits=limits)
    server, _ = build_server(engine, cfg)
    server.start()
    channel = grpc.insecure_channel(f"unix:{sock}")
    stub = pb_grpc.SuffixdStub(channel)
    for ns in ("fz", "fz2"):
        for sid in ("s0", "s1"):
            stub.OpenSession(pb.OpenSessionRequest(namespace=ns, session_id=sid))
    yield stub, engine
    channel.close()
    server.stop(0)
    engine.close()


text_st = st.one_of(st.sampled_from(NAMES + SIDS), st.text(max_size=40),
                    st.text(min_size=250, max_size=300), st.just("a\x00b"))
token_st = st.one_of(st.integers(0, 262143), st.integers(-(2**31), 2**31 - 1))
tokens_st = st.lists(token_st, max_size=30) | st.lists(st.just(5), min_size=5001, max_size=5002)
kind_st = st.integers(-5, 10) | st.sampled_from([1, 2, 3, 4])
float_st = st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, Any]:
    ns = draw(st.sampled_from(NAMES) | text_st)
    sid = draw(st.sampled_from(SIDS) | text_st)
    method = draw(st.sampled_from(["Append", "Speculate", "OpenSession", "DescribeSession",
                                   "CloseSession", "Stats", "Tokenize", "Detokenize",
                                   "AppendBatch", "ListSessions"]))
    if method in ("Append", "AppendBatch"):
        n = 1 if method == "Append" else draw(st.integers(0, 4))
        items = []
        for _ in range(n):
            req = pb.AppendRequest(namespace=ns, session_id=sid, kind=draw(kind_st))
            if draw(st.booleans()):
                req.tokens.ids.extend(draw(tokens_st))
            elif draw(st.booleans()):
                req.text = draw(st.text(max_size=200))
            items.append(req)
        return method, items[0] if method == "Append" else pb.AppendBatchRequest(items=items)
    if method == "Speculate":
        req = pb.SpeculateRequest(namespace=ns, session_id=sid,
                                  max_tokens=draw(st.integers(0, 2**32 - 1) | st.integers(0, 40)))
        if draw(st.booleans()):
            req.context.ids.extend(draw(tokens_st))
        if draw(st.booleans()):
            req.cost_profile.k.extend(draw(st.lists(st.integers(0, 2**32 - 1), max_size=4)))
            req.cost_profile.cost.extend(draw(st.lists(float_st, max_size=4)))
        return method, req
    if method == "OpenSession":
        req = pb.OpenSessionRequest(namespace=ns, session_id=sid,
                                    metadata=draw(st.dictionaries(st.text(max_size=10),
                                                                  st.text(max_size=10),
                                                                  max_size=70)))
        if draw(st.booleans()):
            req.tokens.ids.extend(draw(tokens_st))
        return method, req
    if method == "DescribeSession":
        return method, pb.DescribeSessionRequest(namespace=ns, session_id=sid,
                                                 include_counters=draw(st.booleans()))
    if method == "CloseSession":
        return method, pb.CloseSessionRequest(namespace=ns, session_id=sid,
                                              keep_responses=draw(st.booleans()))
    if method == "Stats":
        return method, pb.StatsRequest(namespace=ns, session_id=sid,
                                       include_sessions=draw(st.booleans()),
                                       top_documents=draw(st.integers(0, 2**32 - 1)))
    if method == "Tokenize":
        return method, pb.TokenizeRequest(text=draw(st.text(max_size=300)))
    if method == "Detokenize":
        return method, pb.DetokenizeRequest(ids=draw(tokens_st))
    return method, pb.ListSessionsRequest(namespace=ns)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(requests(), min_size=1, max_size=8))
def test_fuzz_servicer(served: tuple[Any, Engine], calls: list[tuple[str, Any]]) -> None:
    stub, engine = served
    for method, req in calls:
        try:
            getattr(stub, method)(req, timeout=10)
        except grpc.RpcError as exc:
            assert exc.code() in ALLOWED, (method, req, exc.code(), exc.details())
            assert exc.details()


def test_acknowledged_writes_survive_the_fuzzing(served: tuple[Any, Engine]) -> None:
    stub, engine = served
    stub.OpenSession(pb.OpenSessionRequest(namespace="keep", session_id="k"))
    acked = 0
    for i in range(20):
        stub.Append(pb.AppendRequest(namespace="keep", session_id="k", kind=pb.KIND_RESPONSE,
                                     tokens=pb.TokenList(ids=[1000 + i, 2000 + i, 3000 + i])))
        acked += 3
        with pytest.raises(grpc.RpcError):  # interleaved garbage
            stub.Append(pb.AppendRequest(namespace="keep", session_id="k", kind=99))
    d = stub.DescribeSession(pb.DescribeSessionRequest(namespace="keep", session_id="k"))
    assert d.tokens == acked and d.responses == 20
    stored = [r for r in engine.store.iter_sequences() if r["ns"] == "keep"]
    assert len(stored) == 20
    assert not math.isnan(engine.stats("keep")["keep"]["counters"]["acceptance_rate"])
