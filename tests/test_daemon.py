"""The real daemon: `suffixd serve` subprocess, real socket / TCP, real LMDB, real tokenizer."""

from __future__ import annotations

import json
import os
import random
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from suffixd.client import (
    AlreadyExistsError,
    Client,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    UnauthenticatedError,
)


def rand_seq(rng: random.Random, n: int = 24) -> list[int]:
    # High ids, unlikely to collide with anything a tokenizer produces for test text.
    return [rng.randrange(100_000, 260_000) for _ in range(n)]


def test_session_roundtrip_over_unix_socket(daemon: Client) -> None:
    sock = daemon.proc.socket.removeprefix("unix:")
    mode = stat.S_IMODE(os.stat(sock).st_mode)
    assert mode == 0o600, oct(mode)
    info = daemon.info()
    assert info["vocab_size"] == 262144 and len(info["tokenizer_fingerprint"]) == 32
    assert daemon.health() == "SERVING"

    sql = "SELECT name, country FROM singer WHERE age > 20 ORDER BY age DESC"
    with daemon.session("sql", session_id="s1", metadata={"db": "concert"}) as s:
        r = s.append(text=sql, kind="response")
        assert r.appended == len(r.ids) > 5 and r.accepted == -1
        assert daemon.tokenize(sql) == r.ids
        prefix = daemon.tokenize("SELECT name, country FROM")
        s.append(prefix, kind="prompt")
        d = s.speculate(max_tokens=8)
        assert d.source == "session" and len(d) >= 1
        rest = r.ids[len(prefix):]
        assert d.tokens == rest[: len(d)]
        # The daemon counts acceptance itself: the next generated append is compared.
        a = s.append(rest[:3], kind="generated")
        assert a.accepted == min(3, len(d))
        listed = daemon.list_sessions("sql")
        assert [x.session_id for x in listed] == ["s1"]
        assert listed[0].metadata == {"db": "concert"}
        desc = s.describe(include_counters=True)
        assert desc.counters is not None and desc.counters["steps"] == 1
        with pytest.raises(AlreadyExistsError):
            daemon.open_session("sql", "s1")
    with pytest.raises(NotFoundError):
        daemon.describe_session("sql", "s1")
    stats = daemon.stats("sql")["namespaces"][0]
    c = stats["counters"]
    assert c["steps"] == 1 and c["draft_tokens_accepted"] == min(3, len(d))
    assert c["requests"] == 1
    # One response from the RESPONSE append, one from the pending GENERATED tokens at close.
    assert stats["global"]["sequences"] == 2


def test_namespace_isolation(daemon: Client) -> None:
    rng = random.Random(7)
    secrets_a = [rand_seq(rng, 32) for _ in range(20)]
    with daemon.session("tenant-a") as s:
        for seq in secrets_a:
            s.append(seq, kind="response")
        # Sanity: inside A the secrets are drafted, so the check below is not vacuous.
        d = daemon.speculate("tenant-a", None, secrets_a[0][:8], max_tokens=8)
        assert len(d) >= 1 and d.tokens == secrets_a[0][8: 8 + len(d)]
    forbidden = {t for seq in secrets_a for t in seq}
    with daemon.session("tenant-b") as b:
        b.append(rand_seq(random.Random(8), 64), kind="response")
        for seq in secrets_a:
            for cut in (4, 8, 16):
                for sid in (None, b.id):
                    d = daemon.speculate("tenant-b", sid, seq[:cut], max_tokens=32)
                    assert not forbidden.intersection(d.tokens), d
            b.append(seq[:16], kind="prompt")  # even with A's tokens in B's own session...
            d = b.speculate(max_tokens=32)
            assert not (set(d.tokens) & (forbidden - set(seq[:16])))


def _writer(client: Client, ns: str, idx: int, acked: list[list[int]], stop: threading.Event,
            seed: int) -> None:
    rng = random.Random(seed)
    try:
        sid = client.open_session(ns, f"w{idx}").session_id
        while not stop.is_set():
            seq = rand_seq(rng, 24)
            client.append(ns, sid, seq, kind="response")
            acked.append(seq)
    except Exception:  # the daemon was killed under us: everything acked so far counts
        return


def test_kill9_loses_no_acknowledged_sequence(daemon_factory: Any) -> None:
    proc = daemon_factory()
    acked: list[list[list[int]]] = [[] for _ in range(6)]
    stop = threading.Event()
    clients = [Client(proc.socket, retries=0, timeout=5) for _ in acked]
    threads = [threading.Thread(target=_writer, args=(c, "crash", i, acked[i], stop, 100 + i))
               for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while sum(map(len, acked)) < 300 and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.kill9()  # while the writers are still appending
    stop.set()
    for t in threads:
        t.join(10)
    for c in clients:
        c.close()
    n_acked = sum(map(len, acked))
    assert n_acked >= 100

    # Restart on the same data dir: every acknowledged response is back.
    proc.start()
    client = proc.client()
    ns = client.stats("crash")["namespaces"][0]
    assert ns["global"]["sequences"] >= n_acked
    sessions = {s.session_id: s for s in client.list_sessions("crash")}
    for i, seqs in enumerate(acked):
        # Nothing half-written: a session holds whole appends (acked ones, maybe one more).
        tokens = sessions[f"w{i}"].tokens
        assert tokens in (24 * len(seqs), 24 * (len(seqs) + 1))
    # Drafts reproduce acknowledged sequences (a sample; the store check below is exhaustive).
    for seqs in acked:
        for seq in seqs[-3:]:
            d = client.speculate("crash", None, seq[:8], max_tokens=8)
            assert len(d) >= 1 and d.tokens == seq[8: 8 + len(d)]
    client.close()
    proc.stop()

    from suffixcache.store import Store

    with Store(proc.data_dir / "store") as store:
        stored = {tuple(r["tokens"]) for r in store.iter_sequences() if r["ns"] == "crash"}
    lost = [s for seqs in acked for s in seqs if tuple(s) not in stored]
    assert lost == []


def test_second_daemon_on_same_data_dir_is_refused(daemon: Client, daemon_factory: Any) -> None:
    data_dir = daemon.proc.data_dir
    other = daemon_factory(data_dir=data_dir, args=["--listen", "unix:" + str(data_dir / "b.s")],
                           expect_ready=False)
    assert other.wait(60) == 2
    assert "another suffixd daemon" in other.log()
    assert daemon.health() == "SERVING"  # the first one is unharmed


def test_tokenizer_fingerprint_mismatch_is_refused(daemon_factory: Any, tmp_path: Path) -> None:
    from suffixcache.store import Store

    data_dir = tmp_path / "other-model-data"
    # Data written by a daemon whose model had another vocabulary.
    with Store(data_dir / "store") as store:
        store.check_tokenizer("0123456789abcdef0123456789abcdef", 262144)
    proc = daemon_factory(data_dir=data_dir, expect_ready=False)
    assert proc.wait(60) == 2
    log = proc.log()
    assert "written with tokenizer 0123456789abcdef0123456789abcdef" in log, log
    assert "Traceback" not in log


def test_tcp_requires_bearer_token(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--listen", "127.0.0.1:0"],
                          env={"SUFFIXD_AUTH_TOKEN": "s3cret-token"})
    tcp = proc.tcp
    good = proc.client(tcp, token="s3cret-token")
    assert good.info()["vocab_size"] == 262144
    for token in (None, "wrong", "s3cret-token2"):
        bad = Client(tcp, token=token, retries=0)
        with pytest.raises(UnauthenticatedError):
            bad.info()
        with pytest.raises(UnauthenticatedError):
            bad.ingest_stream(iter([]))  # client-streaming methods are guarded too
        bad.close()
    # Health stays open for probes.
    assert Client(tcp, retries=0).health() == "SERVING"


def test_tcp_without_token_needs_insecure(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--listen", "127.0.0.1:0"], expect_ready=False,
                          env={"SUFFIXD_AUTH_TOKEN": ""})
    assert proc.wait(60) == 2
    assert "needs a bearer token" in proc.log()
    ok = daemon_factory(args=["--listen", "127.0.0.1:0", "--insecure"],
                        env={"SUFFIXD_AUTH_TOKEN": ""})
    c = ok.client(ok.tcp)
    c.wait_ready()
    assert c.info()["vocab_size"] == 262144


def test_limits(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--max-sessions", "3", "--max-tokens-per-call", "1000",
                                "--max-message-bytes", "65536", "--session-idle-timeout", "1.5"])
    c = proc.client(retries=0)
    with pytest.raises(InvalidArgumentError, match="out of range"):
        c.open_session("lim", tokens=[262144])
    with pytest.raises(InvalidArgumentError, match="out of range"):
        c.speculate("lim", None, [-1])
    sids = [c.open_session("lim").session_id for _ in range(3)]
    with pytest.raises(ResourceExhaustedError, match="limit is 3"):
        c.open_session("lim")
    c.open_session("other-ns")  # the limit is per namespace
    with pytest.raises(ResourceExhaustedError, match="limit is 1000"):
        c.append("lim", sids[0], [5] * 1001)
    with pytest.raises(ResourceExhaustedError, match="larger than max"):  # gRPC's own limit
        c.append("lim", sids[0], [200_000] * 30_000)
    with pytest.raises(InvalidArgumentError):
        c.speculate("", None, [1, 2])
    with pytest.raises(InvalidArgumentError, match="NUL"):
        c.open_session("a\x00b")
    with pytest.raises(NotFoundError):
        c.append("lim", "nope", [1])
    with pytest.raises(ResourceExhaustedError):
        c.speculate("lim", sids[0], [1, 2], max_tokens=100_000)
    # Idle sessions expire; a session kept busy does not.
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        c.append("lim", sids[0], [7], kind="prompt")
        if len(c.list_sessions("lim")) == 1:
            break
        time.sleep(0.3)
    assert [s.session_id for s in c.list_sessions("lim")] == [sids[0]]
    assert "closed idle session" in proc.log()


def test_sigterm_is_graceful_and_counters_survive(daemon_factory: Any) -> None:
    proc = daemon_factory()
    c = proc.client()
    rng = random.Random(3)
    seq = rand_seq(rng, 40)
    with c.session("persist") as s:
        s.append(seq, kind="response")
        s.append(seq[:10], kind="prompt")
        d = s.speculate(max_tokens=8)
        s.append(seq[10:14], kind="generated")
        s.append(seq[14:20], kind="response")
    keep = c.open_session("persist", "alive", tokens=seq[:5])
    before = c.stats("persist")["namespaces"][0]
    assert before["counters"]["steps"] == 1 and len(d) >= 1
    c.close()
    assert proc.stop() == 0
    assert "stopped" in proc.log()
    assert not Path(proc.socket.removeprefix("unix:")).exists()
    proc.start()
    c = proc.client()
    after = c.stats("persist")["namespaces"][0]
    assert after["counters"] == before["counters"]
    assert after["global"]["sequences"] == before["global"]["sequences"] == 2
    assert [s.session_id for s in c.list_sessions("persist")] == [keep.session_id]
    assert c.describe_session("persist", "alive").tokens == 5
    c.close()


def test_batch_and_stream_ingest(daemon: Client) -> None:
    from suffixd.v1 import suffixd_pb2 as pb

    rng = random.Random(11)
    sid = daemon.open_session("bulk").session_id
    seqs = [rand_seq(rng, 16) for _ in range(50)]
    r = daemon.append_batch([("bulk", sid, "response", s) for s in seqs[:25]])
    assert r == {"items": 25, "tokens": 400}
    reqs = (pb.AppendRequest(namespace="bulk", session_id=sid, kind=pb.KIND_RESPONSE,
                             tokens=pb.TokenList(ids=s)) for s in seqs[25:])
    assert daemon.ingest_stream(reqs) == {"items": 25, "tokens": 400}
    assert daemon.describe_session("bulk", sid).tokens == 800
    ns = daemon.stats("bulk")["namespaces"][0]
    assert ns["global"]["sequences"] == 50 and ns["counters"]["requests"] == 50
    # A bad item fails the whole batch: nothing of it is applied.
    with pytest.raises(InvalidArgumentError):
        daemon.append_batch([("bulk", sid, "prompt", [1, 2]), ("bulk", sid, "prompt", [10**9])])
    assert daemon.describe_session("bulk", sid).tokens == 800


def test_reflection_lists_services(daemon: Client) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(daemon.channel)
    resp = next(iter(stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]))))
    names = {s.name for s in resp.list_services_response.service}
    assert {"suffixd.v1.Suffixd", "grpc.health.v1.Health"} <= names


def test_sessions_cli(daemon: Client) -> None:
    daemon.open_session("cli-ns", "cli-s", metadata={"k": "v"}, tokens=[1, 2, 3])
    base = [sys.executable, "-m", "suffixd.cli.main", "sessions"]
    sock = ["--address", daemon.proc.socket]
    out = subprocess.run([*base, "list", *sock, "--json"], capture_output=True, text=True,
                         check=True).stdout
    rows = json.loads(out)
    assert any(r["session_id"] == "cli-s" and r["tokens"] == 3 for r in rows)
    out = subprocess.run([*base, "show", *sock, "cli-ns", "cli-s"], capture_output=True,
                         text=True, check=True).stdout
    assert "cli-s" in out and "k=v" in out
    p = subprocess.run([*base, "close", *sock, "cli-ns", "cli-s"], capture_output=True, text=True)
    assert p.returncode == 0
    p = subprocess.run([*base, "close", *sock, "cli-ns", "cli-s"], capture_output=True, text=True)
    assert p.returncode != 0 and "no open session" in p.stderr
    assert "Traceback" not in p.stderr


def test_grpc_status_codes_raw(daemon: Client) -> None:
    # Raw stub (no client mapping): the wire carries the documented status codes.
    from suffixd.v1 import suffixd_pb2 as pb

    with pytest.raises(grpc.RpcError) as ei:
        daemon.stub.Append(pb.AppendRequest(namespace="x", session_id="y",
                                            kind=pb.KIND_PROMPT))
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    sid = daemon.open_session("x").session_id
    with pytest.raises(grpc.RpcError) as ei:
        daemon.stub.Append(pb.AppendRequest(namespace="x", session_id=sid))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_step_appends_and_drafts_in_one_round_trip(daemon: Client) -> None:
    rng = random.Random(21)
    seq = rand_seq(rng, 40)
    with daemon.session("step") as s:
        s.append(seq, kind="response")
        s.append(seq[:8], kind="prompt")
        d = s.speculate(max_tokens=8)
        assert d.accepted == -1 and len(d) >= 2
        # The verifier accepted 3 draft tokens; the next draft continues the sequence.
        d2 = s.step(seq[8:11], max_tokens=8)
        assert d2.accepted == 3 and d2.session_tokens == 51
        assert len(d2) >= 1 and d2.tokens == seq[11: 11 + len(d2)]
        # It accepted 1, then its own token differed from the draft (the bonus token).
        d3 = s.step([seq[11], 7], max_tokens=8)
        assert d3.accepted == 1 and d3.session_tokens == 53
        c = s.describe(include_counters=True).counters
        assert c["steps"] == 2 and c["draft_tokens_accepted"] == 4
    with pytest.raises(InvalidArgumentError, match="needs a session"):
        daemon.step("step", "", [1])


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl command")
def test_tls_with_bearer_token(daemon_factory: Any, tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    proc = daemon_factory(args=["--listen", "127.0.0.1:0", "--tls-cert", str(cert),
                                "--tls-key", str(key)], env={"SUFFIXD_AUTH_TOKEN": "tok"})
    c = proc.client(proc.tcp, token="tok", root_certificates=cert.read_bytes())
    assert c.info()["vocab_size"] == 262144
    with pytest.raises(UnauthenticatedError):
        Client(proc.tcp, retries=0, root_certificates=cert.read_bytes()).info()
    plain = Client(proc.tcp, token="tok", retries=0, timeout=3)  # no TLS: refused
    with pytest.raises(Exception):  # noqa: B017 - UNAVAILABLE or a handshake error
        plain.info()
