"""Hypothesis fuzzing of the Corpus servicer over a real in-process server and Engine.

Hostile or out-of-order input must give a clear status (never INTERNAL/UNKNOWN), and
after any sequence of operations the store and the corpus tree must agree: every
sequence a file record owns is in the tree, nothing else is, and a file whose last
chunk was acknowledged is complete with exactly the units that were sent.
"""

from __future__ import annotations

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
from suffixd.v1 import corpus_pb2 as cpb
from suffixd.v1 import corpus_pb2_grpc as cpb_grpc

ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
           grpc.StatusCode.FAILED_PRECONDITION}
NS = "cfz"
PATHS = ["/c/a.sql", "/c/b.md", "/c/sub/c.txt", ""]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Engine]]:
    data = tmp_path_factory.mktemp("cfuzz")
    limits = Limits(max_message_bytes=1 << 20, session_idle_timeout_s=0)
    engine = Engine(data, model_path="default", limits=limits)
    sock = Path(data) / "c.sock"
    server, _ = build_server(engine, ServeConfig(data_dir=data, listen=[f"unix:{sock}"],
                                                 limits=limits))
    server.start()
    channel = grpc.insecure_channel(f"unix:{sock}")
    yield cpb_grpc.CorpusStub(channel), engine
    channel.close()
    server.stop(0)
    engine.close()


unit_st = st.lists(st.text(max_size=30), max_size=3).map(lambda s: cpb.CorpusUnit(segments=s))
chunk_st = st.builds(
    cpb.FileChunk,
    path=st.sampled_from(PATHS) | st.text(max_size=10),
    content_hash=st.sampled_from(["h1", "h2"]),
    first=st.booleans(),
    last=st.booleans(),
    units=st.lists(unit_st, max_size=4),
)
op_st = st.one_of(
    st.tuples(st.just("warm"), st.lists(st.lists(chunk_st, max_size=3), min_size=1, max_size=3),
              st.sampled_from([NS, "", "x\x00y"])),
    st.tuples(st.just("remove"), st.lists(st.sampled_from(PATHS), max_size=3),
              st.sampled_from([NS, ""])),
    st.tuples(st.just("check"), st.lists(st.sampled_from(PATHS), max_size=3),
              st.sampled_from([NS, ""])),
)


def check_consistent(stub: Any, engine: Engine) -> None:
    files = stub.ListFiles(cpb.ListFilesRequest(namespace=NS)).files
    owned = sum(f.sequences for f in files)
    tree = engine.cache.stats(NS).get(NS, {}).get("corpus", {}).get("sequences", 0)
    assert owned == tree
    stored = [s for s in engine.store.iter_sequences() if s["ns"] == NS and s["kind"] == "corpus"]
    assert len(stored) == owned
    by_doc: dict[str, int] = {}
    for s in stored:
        by_doc[s["doc"]] = by_doc.get(s["doc"], 0) + 1
    assert by_doc == {f.path: f.sequences for f in files if f.sequences}


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(op_st, min_size=1, max_size=6))
def test_corpus_servicer_fuzz(served: tuple[Any, Engine], ops: list[Any]) -> None:
    stub, engine = served
    for kind, payload, ns in ops:
        try:
            if kind == "warm":
                reqs = [cpb.WarmRequest(namespace=ns, chunks=c) for c in payload]
                replies = list(stub.WarmFiles(iter(reqs), timeout=30))
                assert len(replies) == len(reqs)
                for req, rep in zip(reqs, replies, strict=True):
                    # Net sequences stored: a file restarted (first=true) inside the same
                    # request drops what that request had stored for it before.
                    net: dict[str, int] = {}
                    for c in req.chunks:
                        if c.first:
                            net[c.path] = 0
                        net[c.path] = net.get(c.path, 0) + sum(
                            1 for u in c.units if "".join(u.segments))
                    assert rep.units == sum(net.values())
                    assert list(rep.completed) == [c.path for c in req.chunks if c.last]
            elif kind == "remove":
                stub.RemoveFiles(cpb.RemoveFilesRequest(namespace=ns, paths=payload), timeout=30)
            else:
                stub.CheckFiles(cpb.CheckFilesRequest(
                    namespace=ns, files=[cpb.FileRef(path=p, content_hash="h1") for p in payload]),
                    timeout=30)
        except grpc.RpcError as exc:
            assert exc.code() in ALLOWED, (exc.code(), exc.details())
    check_consistent(stub, engine)


def test_warm_then_check_and_remove(served: tuple[Any, Engine]) -> None:
    stub, engine = served
    chunk = cpb.FileChunk(path="/d/x.sql", content_hash="hx", first=True, last=True,
                          units=[cpb.CorpusUnit(segments=["SELECT 1 ;"]),
                                 cpb.CorpusUnit(segments=["<assistant>\n", "done"])])
    (rep,) = stub.WarmFiles(iter([cpb.WarmRequest(namespace="chk", chunks=[chunk])]))
    assert rep.units == 2 and rep.tokens > 3 and list(rep.completed) == ["/d/x.sql"]
    warm = stub.CheckFiles(cpb.CheckFilesRequest(namespace="chk", files=[
        cpb.FileRef(path="/d/x.sql", content_hash="hx"),
        cpb.FileRef(path="/d/x.sql", content_hash="other"),
        cpb.FileRef(path="/d/none", content_hash="hx")])).warm
    assert list(warm) == ["/d/x.sql"]
    # Segments are tokenized apart and concatenated, as the replay protocol does.
    ids = [s for s in engine.store.iter_sequences() if s.get("doc") == "/d/x.sql"]
    tok = engine.tokenizer
    assert ids[1]["tokens"] == tok.tokenize("<assistant>\n") + tok.tokenize("done")
    r = stub.RemoveFiles(cpb.RemoveFilesRequest(namespace="chk", paths=["/d/x.sql", "/d/y"]))
    assert (r.files, r.sequences) == (1, 2)
    assert not stub.ListFiles(cpb.ListFilesRequest(namespace="chk")).files


def test_file_restarted_within_one_request_leaves_no_orphan(served: tuple[Any, Engine]) -> None:
    stub, engine = served
    u = [cpb.CorpusUnit(segments=["SELECT orphan_check FROM t ;"])]
    chunks = [cpb.FileChunk(path="/r/a.sql", content_hash="v1", first=True, last=False, units=u),
              cpb.FileChunk(path="/r/a.sql", content_hash="v2", first=True, last=True,
                            units=u + u)]
    (rep,) = stub.WarmFiles(iter([cpb.WarmRequest(namespace="rst", chunks=chunks)]))
    assert rep.units == 2 and rep.replaced_sequences == 0
    (f,) = stub.ListFiles(cpb.ListFilesRequest(namespace="rst")).files
    assert f.complete and f.sequences == 2 and f.content_hash == "v2"
    assert engine.cache.stats("rst")["rst"]["corpus"]["sequences"] == 2
