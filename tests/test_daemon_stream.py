"""SpeculateStream (Client.stepper / AsyncClient.stepper) against the real daemon: a
`suffixd serve` subprocess on a real Unix socket with a real LMDB, plus an in-process
server for the hypothesis fuzz case (as in test_service_fuzz.py)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from suffixd.client import (
    Client,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    UnauthenticatedError,
)
from suffixd.v1 import suffixd_pb2 as pb
from suffixd.v1 import suffixd_pb2_grpc as pb_grpc

TIER = "daemon"  # tests/conftest.py: real daemons, started by its own fixtures


def rand_seq(rng: random.Random, n: int = 24) -> list[int]:
    # High ids, unlikely to collide with anything a tokenizer produces for test text.
    return [rng.randrange(100_000, 260_000) for _ in range(n)]


def _greedy_steps(draft_tokens: list[int], truth: list[int], pos: int) -> list[int]:
    """What a verifier appends after a draft: the agreeing prefix plus its own token."""
    n = 0
    for a, b in zip(draft_tokens, truth[pos:], strict=False):
        if a != b:
            break
        n += 1
    return truth[pos: pos + n + 1]


def test_stream_drafts_equal_unary_drafts(daemon: Client) -> None:
    """At every step of a stream, unary Speculate on the same session state returns the
    same draft; acceptance and counters follow the unary step's rules."""
    rng = random.Random(1)
    corpus = [rand_seq(rng, 48) for _ in range(6)]
    with daemon.session("eq") as warm:
        for seq in corpus:
            warm.append(seq, kind="response")
    truth = corpus[2][:20] + rand_seq(rng, 5) + corpus[4][10:40]
    with daemon.session("eq", tokens=truth[:6]) as s, s.stepper(max_tokens=8) as stp:
        ds = stp.step()
        assert ds.accepted == -1 and ds.session_tokens == 6 and ds.durable_tokens == 6
        pos, steps, accepted, proposed = 6, 0, 0, 0
        while pos < len(truth):
            du = s.speculate(max_tokens=8)  # same state: no step happened in between
            assert (ds.tokens, ds.parents, ds.probs, ds.source, ds.sources, ds.match_len) == (
                du.tokens, du.parents, du.probs, du.source, du.sources, du.match_len)
            step = _greedy_steps(ds.tokens, truth, pos)
            pos += len(step)
            n_draft = len(ds.tokens)
            ds = stp.step(step)
            assert ds.accepted == len(step) - 1 or (pos == len(truth) and ds.accepted >= 0)
            assert ds.durable_tokens == ds.session_tokens == pos
            steps += 1
            accepted += ds.accepted
            proposed += n_draft
        c = s.describe(include_counters=True).counters
        assert c is not None
        assert (c["steps"], c["draft_tokens_accepted"], c["draft_tokens_proposed"]) == (
            steps, accepted, proposed)
        assert c["generated_tokens"] == len(truth) - 6
        assert steps >= 3 and accepted > 0  # the drafts were not all empty


def test_stream_final_response_feeds_the_global_tree(daemon: Client) -> None:
    rng = random.Random(2)
    resp = rand_seq(rng, 30)
    with daemon.session("fin") as s, s.stepper() as stp:
        stp.step(resp[:10])
        d = stp.step(resp[10:], final=True, draft=False)
        assert d.tokens == [] and d.session_tokens == 30
    # A session of another client drafts the finished response from the global tree.
    d = daemon.speculate("fin", None, resp[:8], max_tokens=8)
    assert len(d) >= 1 and d.tokens == resp[8: 8 + len(d)]
    assert daemon.stats("fin")["namespaces"][0]["counters"]["requests"] == 1


def test_stream_appends_survive_kill9(daemon_factory: Any) -> None:
    """Durable steps: every answered step is back after kill -9. Deferred steps: after the
    restart the session holds a whole-message prefix of what was answered, at least the
    reported durable_tokens."""
    proc = daemon_factory()
    c = proc.client(retries=0)
    rng = random.Random(3)
    durable = rand_seq(rng, 60)
    deferred = rand_seq(rng, 60)
    c.open_session("crash", "dur")
    c.open_session("crash", "def")
    answered_def: list[int] = []
    reported = 0
    st_dur = c.stepper("crash", "dur")
    st_def = c.stepper("crash", "def", defer_commit=True)
    for i in range(0, 60, 3):
        d = st_dur.step(durable[i: i + 3])
        assert d.durable_tokens == d.session_tokens == i + 3
        d = st_def.step(deferred[i: i + 3])
        answered_def.append(i + 3)
        assert d.session_tokens == i + 3 and d.durable_tokens <= d.session_tokens
        reported = max(reported, d.durable_tokens)
    proc.kill9()  # streams still open, no close, no wait
    st_dur.cancel()
    st_def.cancel()
    c.close()
    proc.start()
    c = proc.client()
    assert c.describe_session("crash", "dur").tokens == 60
    n = c.describe_session("crash", "def").tokens
    assert n >= reported and n in answered_def
    # The trees hold the committed content: drafts reproduce it.
    d = c.speculate("crash", "dur", durable[:10], max_tokens=8)
    assert len(d) >= 1 and d.tokens == durable[10: 10 + len(d)]
    # Closing a deferred stepper waits for its commits.
    c.open_session("crash", "def2")
    with c.stepper("crash", "def2", defer_commit=True) as stp:
        for i in range(0, 30, 3):
            stp.step(deferred[i: i + 3])
    proc.kill9()
    c.close()
    proc.start()
    c = proc.client()
    assert c.describe_session("crash", "def2").tokens == 30
    c.close()


def test_stream_errors_are_statuses(daemon: Client) -> None:
    sid = daemon.open_session("err").session_id
    vocab = daemon.info()["vocab_size"]
    with pytest.raises(NotFoundError):
        daemon.stepper("err", "nope").step()
    with pytest.raises(InvalidArgumentError):
        daemon.stepper("", sid).step()
    stp = daemon.stepper("err", sid)
    assert stp.step([5, 6]).session_tokens == 2
    with pytest.raises(InvalidArgumentError, match="out of range"):
        stp.step([7, vocab])
    assert stp.closed  # the failed step ended the stream...
    with pytest.raises(ValueError, match="closed"):
        stp.step([1])
    # ...and applied nothing of itself; the earlier step stays.
    assert daemon.describe_session("err", sid).tokens == 2
    with pytest.raises(ResourceExhaustedError, match="max_tokens"):
        daemon.stepper("err", sid).step([1], max_tokens=100_000)
    with pytest.raises(InvalidArgumentError, match="cost profile"):
        daemon.stepper("err", sid, cost_profile={0: float("nan")}).step()
    assert daemon.describe_session("err", sid).tokens == 2

    # Raw stub: the wire statuses; switching to a bad session ends the stream.
    def call(reqs: list[pb.StepRequest]) -> tuple[int, grpc.StatusCode]:
        n = 0
        try:
            for _ in daemon.stub.SpeculateStream(iter(reqs), timeout=10):
                n += 1
        except grpc.RpcError as exc:
            return n, exc.code()
        return n, grpc.StatusCode.OK

    other = daemon.open_session("err").session_id
    assert call([pb.StepRequest(namespace="err", session_id=sid),
                 pb.StepRequest(session_id=other)]) == (1, grpc.StatusCode.INVALID_ARGUMENT)
    assert call([pb.StepRequest(namespace="err", session_id=sid),
                 pb.StepRequest(namespace="err", session_id="gone")]) == (
        1, grpc.StatusCode.NOT_FOUND)
    assert call([pb.StepRequest(namespace="err", session_id=sid, append=[1], append_kind=9)]
                ) == (0, grpc.StatusCode.INVALID_ARGUMENT)
    assert call([pb.StepRequest(session_id=sid)]) == (0, grpc.StatusCode.INVALID_ARGUMENT)
    assert call([]) == (0, grpc.StatusCode.OK)
    # A closed session: NOT_FOUND on the next step of an open stream.
    stp = daemon.stepper("err", other)
    stp.step([1])
    daemon.close_session("err", other)
    with pytest.raises(NotFoundError):
        stp.step([2])
    assert daemon.health() == "SERVING"
    assert daemon.describe_session("err", sid).tokens == 2


def test_stream_namespace_isolation(daemon: Client) -> None:
    rng = random.Random(4)
    secrets_a = [rand_seq(rng, 32) for _ in range(10)]
    with daemon.session("iso-a") as a:
        with a.stepper() as stp:
            for seq in secrets_a:
                stp.step(seq, final=True, draft=False)
        d = daemon.speculate("iso-a", None, secrets_a[0][:8], max_tokens=8)
        assert len(d) >= 1 and d.tokens == secrets_a[0][8: 8 + len(d)]  # not vacuous
    forbidden = {t for seq in secrets_a for t in seq}
    with daemon.session("iso-b") as b, b.stepper(max_tokens=32) as stp:
        for seq in secrets_a:
            d = stp.step(seq[:16], kind="prompt")  # A's tokens in B's own session
            assert not (set(d.tokens) & (forbidden - set(seq[:16]))), d
        # Switching sessions on a stream resolves (namespace, session id) afresh: B's
        # session id is unknown in A.
        raw = [pb.StepRequest(namespace="iso-b", session_id=b.id),
               pb.StepRequest(namespace="iso-a", session_id=b.id)]
        with pytest.raises(grpc.RpcError) as ei:
            list(daemon.stub.SpeculateStream(iter(raw), timeout=10))
        assert ei.value.code() == grpc.StatusCode.NOT_FOUND


def test_one_stream_for_many_sessions(daemon: Client) -> None:
    """use_session switches the stream; each session gets its own appends, drafts and
    acceptance, deferred commits of every session are waited for at the end."""
    rng = random.Random(6)
    seqs = [rand_seq(rng, 30) for _ in range(3)]
    sids = [daemon.open_session("multi", tokens=seq[:10]).session_id for seq in seqs]
    for seq in seqs:
        daemon.append("multi", daemon.open_session("multi").session_id, seq, kind="response")
    with daemon.stepper("multi", sids[0], max_tokens=8, defer_commit=True) as stp:
        for rnd in range(2):
            for sid, seq in zip(sids, seqs, strict=True):
                stp.use_session("multi", sid)
                d = stp.step(seq[10 + 5 * rnd: 15 + 5 * rnd])
                assert d.session_tokens == 15 + 5 * rnd
                assert d.tokens == seq[15 + 5 * rnd: 15 + 5 * rnd + len(d)] and len(d) >= 1
                if rnd:
                    assert d.accepted == 5  # its own previous draft, not another session's
    for sid in sids:
        assert daemon.describe_session("multi", sid, include_counters=True).tokens == 20


def test_concurrent_streams_and_async_client(daemon: Client) -> None:
    from suffixd.client import AsyncClient

    rng = random.Random(5)
    seqs = [rand_seq(rng, 40) for _ in range(8)]
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            with daemon.session("conc", session_id=f"t{i}") as s, \
                    s.stepper(defer_commit=i % 2 == 1) as stp:
                for j in range(0, 40, 4):
                    d = stp.step(seqs[i][j: j + 4])
                    assert d.session_tokens == j + 4
                assert s.describe().tokens == 40
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []

    async def aio() -> tuple[int, int, list[int]]:
        async with AsyncClient(daemon.proc.socket) as ac:
            s = await ac.session("conc", session_id="aio", tokens=seqs[7][:10])
            async with s, s.stepper(max_tokens=8) as stp:
                d0 = await stp.step()
                d1 = await stp.step(seqs[7][10:13])
                with pytest.raises(InvalidArgumentError):
                    await stp.step([-1])
                return d1.accepted, d1.session_tokens, d0.tokens

    accepted, n, first = asyncio.run(aio())
    assert n == 13 and accepted == min(3, len(first))


def test_stream_needs_the_bearer_token_on_tcp(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--listen", "127.0.0.1:0"], env={"SUFFIXD_AUTH_TOKEN": "tok"})
    good = proc.client(proc.tcp, token="tok")
    sid = good.open_session("auth").session_id
    with good.stepper("auth", sid) as stp:
        assert stp.step([1, 2]).session_tokens == 2
    for token in (None, "wrong"):
        bad = Client(proc.tcp, token=token, retries=0)
        with pytest.raises(UnauthenticatedError):
            bad.stepper("auth", sid).step([3])
        bad.close()
    assert good.describe_session("auth", sid).tokens == 2
    good.close()


def test_stream_limit(daemon_factory: Any, tmp_path: Path) -> None:
    """Streams beyond the limit are refused at once; unary RPCs keep working."""
    from suffixd.daemon.engine import Engine
    from suffixd.daemon.server.serve import build_server
    from suffixd.daemon.server.serve_config import ServeConfig

    data = tmp_path / "limit"
    engine = Engine(data, vocab_size=1000)
    cfg = ServeConfig(data_dir=data, listen=[f"unix:{data / 's.sock'}"], max_streams=2,
                      max_workers=4)
    server, _ = build_server(engine, cfg)
    server.start()
    try:
        c = Client(f"unix:{data / 's.sock'}", retries=0, timeout=10)
        sid = c.open_session("lim").session_id
        open_ = [c.stepper("lim", sid) for _ in range(2)]
        for s in open_:
            s.step([1])
        with pytest.raises(ResourceExhaustedError, match="limit is 2"):
            c.stepper("lim", sid).step([1])
        assert c.describe_session("lim", sid).tokens == 2
        for s in open_:
            s.close()
        with c.stepper("lim", sid) as s:  # a slot is free again
            assert s.step([3]).session_tokens == 3
        c.close()
    finally:
        server.stop(0)
        engine.close()


# ------------------------------------------------------------------------------ fuzz
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    from suffixd.daemon.common.config import Limits
    from suffixd.daemon.engine import Engine
    from suffixd.daemon.server.serve import build_server
    from suffixd.daemon.server.serve_config import ServeConfig

    data = tmp_path_factory.mktemp("stream-fuzz")
    limits = Limits(max_tokens_per_call=5000, session_idle_timeout_s=0)
    engine = Engine(data, vocab_size=262144, limits=limits)
    sock = data / "f.sock"
    server, _ = build_server(engine, ServeConfig(data_dir=data, listen=[f"unix:{sock}"],
                                                 limits=limits))
    server.start()
    channel = grpc.insecure_channel(f"unix:{sock}")
    stub = pb_grpc.SuffixdStub(channel)
    for sid in ("s0", "s1"):
        stub.OpenSession(pb.OpenSessionRequest(namespace="fz", session_id=sid))
    yield stub, engine
    channel.close()
    server.stop(0)
    engine.close()


name_st = st.sampled_from(["fz", "", "other", "a\x00b"]) | st.text(max_size=20)
sid_st = st.sampled_from(["s0", "s1", "", "ghost"]) | st.text(max_size=20)
token_st = st.integers(0, 262143) | st.integers(-(2**31), 2**31 - 1)


@st.composite
def step_requests(draw: st.DrawFn) -> pb.StepRequest:
    req = pb.StepRequest(
        append=draw(st.lists(token_st, max_size=12)
                    | st.lists(st.just(5), min_size=5001, max_size=5002)),
        append_kind=draw(st.integers(-3, 8)),
        max_tokens=draw(st.integers(0, 40) | st.integers(0, 2**32 - 1)),
        no_draft=draw(st.booleans()),
        defer_commit=draw(st.booleans()),
    )
    if draw(st.booleans()):
        req.namespace = draw(name_st)
        req.session_id = draw(sid_st)
    if draw(st.booleans()):
        req.cost_profile.k.extend(draw(st.lists(st.integers(0, 2**32 - 1), max_size=3)))
        req.cost_profile.cost.extend(draw(st.lists(st.floats(), max_size=3)))
    return req


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(step_requests(), max_size=6))
def test_fuzz_stream(served: tuple[Any, Any], reqs: list[pb.StepRequest]) -> None:
    stub, engine = served
    before = {sid: engine.describe_session("fz", sid)["tokens"] for sid in ("s0", "s1")}
    replies = []
    code = grpc.StatusCode.OK
    try:
        for r in stub.SpeculateStream(iter(reqs), timeout=20):
            replies.append(r)
    except grpc.RpcError as exc:
        code = exc.code()
        assert exc.details()
    assert code in ALLOWED, (code, reqs)
    assert len(replies) <= len(reqs)
    if code == grpc.StatusCode.OK:
        assert len(replies) == len(reqs)
    # Every answered step's tokens are in the session (a fuzzed stream can only have
    # worked on s0 or s1 of "fz": the first message names it).
    if replies and reqs[0].namespace == "fz" and reqs[0].session_id in before:
        sid = reqs[0].session_id
        after = engine.describe_session("fz", sid)["tokens"]
        answered = sum(len(r.append) for r in reqs[: len(replies)])
        assert after == before[sid] + answered
        assert replies[-1].session_tokens == after
    # The server is alive and answers.
    stub.DescribeSession(pb.DescribeSessionRequest(namespace="fz", session_id="s0"))
