"""The OpenAI-compatible endpoint with real clients: the official ``openai`` package and
httpx against a real daemon (`suffixd serve --http`) on the embedded model."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import llama_cpp
import openai
import pytest
from starlette.testclient import TestClient
from suffixd.daemon.http_api.app import OpenAIFront
from suffixd.daemon.http_api.guard import HostRule, is_json_type, parse_allowed_hosts
from suffixd.daemon.http_api.session_finder import SessionFinder
from suffixd.daemon.model import embedded_model_path

from tests.conftest import wait_costs_measured

SYSTEM = "You translate questions into SQL. Schema: singer(id, name, age, country)."


@pytest.fixture(scope="module")
def http_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.conftest import DaemonProcess

    proc = DaemonProcess(tmp_path_factory.mktemp("http") / "data",
                         ["--http", "127.0.0.1:0"]).start()
    client = proc.client()
    client.proc = proc
    assert proc.http and proc.http.startswith("http://127.0.0.1:")
    client.oai = openai.OpenAI(base_url=proc.http, api_key="none", max_retries=0, timeout=120)
    yield client
    client.close()
    proc.stop()


def ns_headers(ns: str, session: str | None = None) -> dict[str, str]:
    h = {"X-Suffixd-Namespace": ns}
    if session:
        h["X-Suffixd-Session"] = session
    return h


def test_models_and_unknown_model(http_daemon: Any) -> None:
    models = http_daemon.oai.models.list()
    ids = [m.id for m in models.data]
    assert ids and ids[0].startswith("gemma")
    with pytest.raises(openai.NotFoundError) as err:
        http_daemon.oai.chat.completions.create(
            model="gpt-17", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert "does not exist" in str(err.value)


def test_chat_equals_the_grpc_path_streaming_or_not(http_daemon: Any) -> None:
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "How many singers are there?"}]
    grpc_text = "".join(c.text for c in http_daemon.generate(
        "g-ref", messages=msgs, max_tokens=16, namespace="eq"))
    r = http_daemon.oai.chat.completions.create(
        model="default", messages=msgs, max_tokens=16, temperature=0,
        extra_headers=ns_headers("eq-http"))
    assert r.choices[0].message.content == grpc_text
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 20
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    extra = r.model_extra["suffixd"]
    assert extra["namespace"] == "eq-http" and extra["session"]
    assert "token_ids" not in r.choices[0].model_extra
    # vLLM's return_token_ids: the generated tokens, which spell the content
    r = http_daemon.oai.chat.completions.create(
        model="default", messages=msgs, max_tokens=16, temperature=0,
        extra_headers=ns_headers("eq-ids"), extra_body={"return_token_ids": True})
    ids = r.choices[0].model_extra["token_ids"]
    assert len(ids) == r.usage.completion_tokens and all(isinstance(t, int) for t in ids)
    vocab = llama_cpp.Llama(str(embedded_model_path()), vocab_only=True, verbose=False)
    assert vocab.detokenize(ids).decode("utf-8", errors="replace") == grpc_text
    # streamed: each step's ids in its first event, joined the same ids
    events = http_daemon.oai.chat.completions.create(
        model="default", messages=msgs, max_tokens=16, temperature=0, stream=True,
        extra_headers=ns_headers("eq-ids-stream"), extra_body={"return_token_ids": True})
    streamed: list[int] = []
    for ev in events:
        if ev.choices:
            streamed += (ev.choices[0].model_extra or {}).get("token_ids") or []
    assert streamed == ids
    stream = http_daemon.oai.chat.completions.create(
        model="default", messages=msgs, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_headers=ns_headers("eq-stream"))
    parts, usage, finish = [], None, None
    for ev in stream:
        if ev.choices:
            parts.append(ev.choices[0].delta.content or "")
            finish = ev.choices[0].finish_reason or finish
        if ev.usage is not None:
            usage = ev.usage
    assert "".join(parts) == grpc_text
    assert finish in ("length", "stop")
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens


def test_completions_with_stop_strings(http_daemon: Any) -> None:
    prompt = "SELECT name, age FROM singer WHERE country = 'France' ORDER BY"
    full = http_daemon.oai.completions.create(
        model="default", prompt=prompt, max_tokens=24, temperature=0,
        extra_headers=ns_headers("comp"))
    text = full.choices[0].text
    assert text and full.usage.completion_tokens >= 1
    # A stop string taken from the middle of the greedy output truncates it there.
    words = [w for w in text.split() if w.strip()]
    assert len(words) >= 2, text
    stop = words[1]
    cut = http_daemon.oai.completions.create(
        model="default", prompt=prompt, max_tokens=24, temperature=0, stop=[stop],
        extra_headers=ns_headers("comp"))
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]
    streamed = "".join(
        ev.choices[0].text for ev in http_daemon.oai.completions.create(
            model="default", prompt=prompt, max_tokens=24, temperature=0, stop=stop,
            stream=True, extra_headers=ns_headers("comp")) if ev.choices)
    assert streamed == cut.choices[0].text


def test_a_one_off_completion_again_is_drafted_from_the_first(http_daemon: Any) -> None:
    """A text completion without a session learns: its response enters the namespace's
    global tree, and the same request again is drafted from it (and starts from the
    first one's prompt checkpoint)."""
    prompt = ("-- schema: singer(singer_id, name, country, song_name, song_release_year, age,\n"
              "--   is_male), concert(concert_id, concert_name, theme, stadium_id, year),\n"
              "--   singer_in_concert(concert_id, singer_id)\n"
              "-- the singers of every country, oldest first, with their concerts\n"
              "SELECT singer.name, singer.country, singer.age, concert.concert_name FROM")
    replies = [http_daemon.oai.completions.create(
        model="default", prompt=prompt, max_tokens=32, temperature=0,
        extra_headers=ns_headers("one-off")) for _ in range(2)]
    first, second = (r.model_extra["suffixd"] for r in replies)
    assert second["accepted"] >= first["accepted"] + 12, (first, second)
    assert replies[1].usage.prompt_tokens_details.cached_tokens \
        == replies[1].usage.prompt_tokens - 1
    assert not http_daemon.list_sessions("one-off")  # their own sessions, closed


def test_sampling_is_seeded(http_daemon: Any) -> None:
    msgs = [{"role": "user", "content": "Write a SQL query about singers."}]
    kw: dict[str, Any] = dict(model="default", messages=msgs, max_tokens=12, temperature=0.9,
                              seed=7)
    # Both runs under one cost profile (the daemon measures it while serving): it decides
    # how batches are padded, and llama.cpp's logits differ in their last bits between
    # batch shapes, enough to flip a near-tied sample.
    http_daemon.oai.completions.create(model="default", prompt="SELECT", max_tokens=1,
                                       extra_headers=ns_headers("seeded-load"))
    wait_costs_measured(http_daemon)
    # The seed reaches the sampler: the same seed in two namespaces draws the same first
    # token, and other seeds draw other texts. (That the drafts do not change a seeded
    # run is certified in-process, where the logits are at hand: a later token may part
    # where llama.cpp's batch-shape rounding flips a near-tied race, ~2% of tokens at
    # this temperature on this model, tests/test_verifier_sampling.py.)
    a, b = (http_daemon.oai.chat.completions.create(**kw, extra_headers=ns_headers(ns))
            for ns in ("seeded-a", "seeded-b"))
    first = [r.usage.completion_tokens for r in (a, b)]
    assert all(n >= 1 for n in first)
    ta, tb = (r.choices[0].message.content for r in (a, b))
    assert ta and tb and ta.split()[:1] == tb.split()[:1], (ta, tb)
    others = {http_daemon.oai.chat.completions.create(
        **{**kw, "seed": seed}, extra_headers=ns_headers("seeded-a")).choices[0].message.content
        for seed in (8, 9, 10)}
    assert len(others | {ta}) >= 2, others


def _turn(oai: Any, ns: str, msgs: list[dict[str, str]]) -> tuple[str, dict[str, Any], Any]:
    r = oai.chat.completions.create(model="default", messages=msgs, max_tokens=12,
                                    temperature=0, extra_headers=ns_headers(ns))
    return r.choices[0].message.content, r.model_extra["suffixd"], r.usage


def test_an_agent_conversation_is_found_without_a_header(http_daemon: Any) -> None:
    ns = "agent"
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "List the names of all singers."}]
    sessions, cached = [], []
    for i, question in enumerate(["Count the singers from France.",
                                  "What is the average age of singers?", None]):
        reply, extra, usage = _turn(http_daemon.oai, ns, msgs)
        sessions.append(extra["session"])
        cached.append(usage.prompt_tokens_details.cached_tokens)
        assert extra["session_found"] == (i > 0)
        if question is None:
            break
        # as an agent resends it: the whole history, the reply, the next question
        msgs = [*msgs, {"role": "assistant", "content": reply},
                {"role": "user", "content": question}]
    assert len(set(sessions)) == 1
    assert cached[0] == 0 and all(c > 20 for c in cached[1:])  # the session's KV is reused
    listed = http_daemon.list_sessions(ns)
    assert [s.session_id for s in listed] == sessions[:1]
    assert listed[0].responses == 3
    st = http_daemon.stats(namespace=ns)
    entry = next(e for e in st["namespaces"] if e["namespace"] == ns)
    counters = entry["counters"]
    assert int(counters["steps"]) > 0 and int(counters["requests"]) == 3, counters


def test_new_conversations_pay_only_for_what_differs_from_a_shared_system_prompt(
        http_daemon: Any) -> None:
    """An agent's next task: the same 1,000-token system prompt, a new conversation, no
    header. Its KV comes from the first conversation's checkpoint (another namespace's
    does not count)."""
    deadline = time.monotonic() + 600  # the model loads in the background (slow when busy)
    while not http_daemon.generator_status()["loaded"] and time.monotonic() < deadline:
        time.sleep(1)
    tables = ", ".join(f"table_{i}(id, name_{i}, value_{i}, created_at)" for i in range(60))
    system = f"You translate questions into SQL for this schema: {tables}. Answer with SQL."
    usages = []
    for ns, question in (("tasks", "How many rows has table_3?"),
                         ("tasks", "List the names in table_7."),
                         ("other-tenant", "List the names in table_7.")):
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        _, extra, usage = _turn(http_daemon.oai, ns, msgs)
        assert not extra["session_found"]
        usages.append(usage)
    first, second, other = usages
    assert first.prompt_tokens > 1000
    assert first.prompt_tokens_details.cached_tokens == 0
    # all of the system prompt, none of the question (it starts within its last tokens)
    assert first.prompt_tokens - 40 < second.prompt_tokens_details.cached_tokens \
        < second.prompt_tokens - 5
    assert other.prompt_tokens_details.cached_tokens == 0
    pc = http_daemon.generator_status()["prompt_cache"]
    assert pc["hits"] >= 1 and pc["reused_tokens"] >= 1000 and pc["entries"] >= 1


def test_interleaved_conversations_with_one_system_prompt_stay_apart(http_daemon: Any) -> None:
    ns = "interleaved"
    convs: dict[str, list[dict[str, str]]] = {
        "a": [{"role": "system", "content": SYSTEM},
              {"role": "user", "content": "Which singers are older than 30?"}],
        "b": [{"role": "system", "content": SYSTEM},
              {"role": "user", "content": "Show every country with a singer."}],
    }
    seen: dict[str, set[str]] = {"a": set(), "b": set()}
    for turn in range(3):
        for name in ("a", "b"):
            reply, extra, _ = _turn(http_daemon.oai, ns, convs[name])
            seen[name].add(extra["session"])
            convs[name] += [{"role": "assistant", "content": reply},
                            {"role": "user", "content": f"And turn {turn} for {name}?"}]
    assert len(seen["a"]) == 1 and len(seen["b"]) == 1 and seen["a"] != seen["b"]
    assert len(http_daemon.list_sessions(ns)) == 2


def _post(base: str, path: str, body: Any, **kw: Any) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(base + path, content=data, timeout=60,
                      headers={"Content-Type": "application/json", **kw.pop("headers", {})},
                      **kw)


@pytest.mark.parametrize(("body", "status", "fragment"), [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n=1"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**9}, 400, "limit"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, 400, "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "number"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": 5}, 400, "stop"),
    ({"messages": [{"role": "user", "content": "x"}], "return_token_ids": 1}, 400, "boolean"),
])
def test_bad_requests_get_openai_shaped_errors(http_daemon: Any, body: Any, status: int,
                                               fragment: str) -> None:
    base = http_daemon.proc.http.removesuffix("/v1")
    r = _post(base, "/v1/chat/completions", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and err["type"] == "invalid_request_error"
    assert set(err) >= {"message", "type", "param", "code"}
    r = _post(base, "/v1/completions", {"prompt": {"a": 1}})
    assert r.status_code == 400 and "prompt" in r.json()["error"]["message"]
    assert httpx.get(base + "/v1/nothing-here", timeout=10).status_code == 404


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": 1}, "stream"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "wizard", "content": "x"}]},
     "messages[1].role"),
])
def test_stream_and_roles_are_checked_with_the_param_named(http_daemon: Any, body: Any,
                                                           param: str) -> None:
    """Issue 44, item 8: ``"stream": "yes"`` was taken as true, and an unknown role was a
    400 naming no param; OpenAI answers both with a 400 naming the field."""
    base = http_daemon.proc.http.removesuffix("/v1")
    for path in ("/v1/chat/completions", "/v1/completions"):
        if path == "/v1/completions":
            if param != "stream":
                continue
            body = {"prompt": "SELECT", "stream": body["stream"]}
        r = _post(base, path, body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["type"] == "invalid_request_error", err


def test_client_disconnect_mid_stream_stops_generation(http_daemon: Any) -> None:
    base = http_daemon.proc.http.removesuffix("/v1")
    body = {"prompt": "SELECT * FROM singer WHERE", "max_tokens": 2000, "temperature": 0,
            "ignore_eos": True, "stream": True}
    headers = {"Content-Type": "application/json", **ns_headers("dc", "dc1")}
    with httpx.Client(timeout=60) as c, c.stream(
            "POST", base + "/v1/completions", content=json.dumps(body), headers=headers) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # one event, then hang up
    time.sleep(1.0)
    before = http_daemon.describe_session("dc", "dc1").tokens
    time.sleep(1.5)
    after = http_daemon.describe_session("dc", "dc1").tokens
    assert after == before, "generation went on after the client left"
    assert after < 2000
    assert hang_ups(http_daemon, "dc1") == 1
    # the daemon serves on, the session's slot was released: the same session generates
    r2 = http_daemon.oai.completions.create(
        model="default", prompt="SELECT name FROM", max_tokens=3, temperature=0,
        extra_headers=ns_headers("dc", "dc1"), timeout=60)
    assert r2.usage.completion_tokens >= 1


def hang_ups(http_daemon: Any, session: str) -> int:
    """The daemon's log lines for clients of ``session`` that hung up (one per request)."""
    return sum("client disconnected; generation cancelled" in line
               and f"session={session}" in line.split()
               for line in http_daemon.proc.log().splitlines())


def test_client_disconnect_without_streaming_stops_generation(http_daemon: Any) -> None:
    """A client that hangs up on an answer that is not streamed (nothing is sent until
    the end) stops its generation at the next step too, and the daemon logs no error."""
    base = http_daemon.proc.http.removesuffix("/v1")
    # the model loaded (a first request of this module may have to load it)
    http_daemon.oai.completions.create(model="default", prompt="SELECT", max_tokens=1,
                                       extra_headers=ns_headers("dc"), timeout=900)
    body = {"prompt": "SELECT * FROM singer WHERE", "max_tokens": 2000, "temperature": 0,
            "ignore_eos": True}
    headers = {"Content-Type": "application/json", **ns_headers("dc", "dc2")}
    with httpx.Client(timeout=httpx.Timeout(60, read=3.0)) as c, \
            pytest.raises(httpx.ReadTimeout):
        c.post(base + "/v1/completions", content=json.dumps(body), headers=headers)
    # hung up (the client closed its connection on the timeout)
    time.sleep(1.0)
    before = http_daemon.describe_session("dc", "dc2").tokens
    time.sleep(1.5)
    after = http_daemon.describe_session("dc", "dc2").tokens
    assert after == before, "generation went on after the client left"
    assert after < 2000
    log = http_daemon.proc.log()
    assert hang_ups(http_daemon, "dc2") == 1
    assert "Traceback" not in log and "internal error" not in log
    r2 = http_daemon.oai.completions.create(
        model="default", prompt="SELECT name FROM", max_tokens=3, temperature=0,
        extra_headers=ns_headers("dc", "dc2"), timeout=60)
    assert r2.usage.completion_tokens >= 1


def test_auth_and_limits_on_a_non_loopback_listener(daemon_factory: Any) -> None:
    proc = daemon_factory(args=["--http", "0.0.0.0:0", "--auth-token", "s3cret",
                                "--max-message-bytes", "65536"])
    port = proc.http.rsplit(":", 1)[1].split("/")[0]
    base = f"http://127.0.0.1:{port}/v1"
    for key, ok in (("wrong", False), ("s3cret", True)):
        oai = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=30)
        if ok:
            assert oai.models.list().data
        else:
            with pytest.raises(openai.AuthenticationError):
                oai.models.list()
    r = httpx.get(base + "/models", timeout=10)
    assert r.status_code == 401 and "bearer token" in r.json()["error"]["message"]
    big = {"prompt": "x" * 100_000}
    r = _post(base.removesuffix("/v1"), "/v1/completions", big,
              headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


def test_a_public_address_without_token_is_refused(tmp_path: Any) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "suffixd.cli.main", "serve", "--data-dir", str(tmp_path / "d"),
         "--http", "0.0.0.0:0"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "needs a bearer token" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "d" / "store").exists()  # refused before anything was built


# ------------------------------------------ web pages that drive a daemon (issue 44, item 7)
def _front(token: str | None = None, hosts: HostRule | None = None) -> TestClient:
    """The front alone (no model): what refuses a request does so before generating."""
    engine = SimpleNamespace(model_path=None, limits=None)
    generation = SimpleNamespace(not_ready=lambda: "")
    front = OpenAIFront(engine, generation, token=token,  # type: ignore[arg-type]
                        require_token=bool(token), max_body_bytes=1 << 20, hosts=hosts)
    return TestClient(front.app)


def test_which_hosts_a_front_answers() -> None:
    loop = HostRule("127.0.0.1", "127.0.0.1")
    for ok in ("127.0.0.1:8080", "localhost:8080", "LOCALHOST.", "[::1]:8080", "127.0.0.1",
               None):
        assert loop.allows(ok), ok
    for bad in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example", "10.0.0.1",
                "", "localhost.evil.example:8080"):
        assert not loop.allows(bad), bad
    # every address: any IP literal (no rebinding can send one), loopback, no other name
    anywhere = HostRule("0.0.0.0", "0.0.0.0")
    assert anywhere.allows("10.1.2.3:80") and anywhere.allows("localhost")
    assert anywhere.allows("[fe80::1]:80") and not anywhere.allows("myhost.lan")
    one = HostRule("192.168.1.5", "192.168.1.5")
    assert one.allows("192.168.1.5:8080") and not one.allows("localhost")
    assert not one.allows("192.168.1.6")
    six = HostRule("::1", "::1")
    assert six.allows("[::1]:8080") and six.allows("localhost") and not six.allows("evil.x")
    named = HostRule("myhost.lan", "192.168.1.5", parse_allowed_hosts(["agent.internal,Other:80"]))
    for ok in ("myhost.lan:8080", "AGENT.internal", "other", "192.168.1.5"):
        assert named.allows(ok), ok
    assert not named.allows("evil.example")
    assert HostRule("127.0.0.1", "127.0.0.1", ["*"]).allows("evil.example")
    assert parse_allowed_hosts(["a, [::1]:80", "*"]) == ["a", "::1", "*"]
    assert "--allowed-hosts evil.example" in loop.describe("evil.example:8080")


def test_a_foreign_host_is_refused_before_any_route() -> None:
    """DNS rebinding: a page on evil.example re-pointed at 127.0.0.1 sends its own name
    as the Host, on the API, the dashboard and /health alike."""
    client = _front(hosts=HostRule("127.0.0.1", "127.0.0.1"))
    r = client.get("/v1/models", headers={"Host": "evil.example:8080"})
    assert r.status_code == 403, r.text
    err = r.json()["error"]
    assert err["code"] == "host_not_allowed" and "evil.example" in err["message"]
    for path in ("/dashboard/history.json", "/dashboard", "/health"):
        r = client.get(path, headers={"Host": "evil.example"})
        assert r.status_code == 403 and "--allowed-hosts" in r.text, path
    assert client.get("/v1/models", headers={"Host": "localhost:8080"}).status_code == 200
    assert client.get("/health", headers={"Host": "127.0.0.1:8080"}).status_code == 200


def test_a_body_that_is_not_sent_as_json_is_refused() -> None:
    """A CORS simple request (text/plain, a form, or no type: no preflight) reaches the
    daemon from any page; only a JSON type, which a browser preflights, is taken."""
    client = _front()
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
    for kind in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                 "multipart/form-data; boundary=x", None):
        headers = {"Origin": "http://evil.example"}
        if kind is not None:
            headers["Content-Type"] = kind
        r = client.post("/v1/chat/completions", content=body, headers=headers)
        assert r.status_code == 415, (kind, r.text)
        err = r.json()["error"]
        assert err["code"] == "unsupported_media_type" and "application/json" in err["message"]
    for kind in ("application/json", "Application/JSON; charset=utf-8",
                 "application/vnd.api+json"):
        assert is_json_type(kind), kind
    for kind in ("text/json-ish", "json", "application/jsonp", "+json", None, ""):
        assert not is_json_type(kind), kind


def test_the_bearer_scheme_is_case_insensitive_on_the_api_too() -> None:
    """Issue 44, item 8: 'bearer TOKEN' (RFC 7235: the scheme in any case) was refused on
    /v1 and accepted on /dashboard."""
    client = _front(token="s3cret")
    for header in ("bearer s3cret", "BEARER s3cret", "Bearer s3cret"):
        assert client.get("/v1/models", headers={"Authorization": header}).status_code == 200
        assert client.get("/dashboard/static/dashboard.css",
                          headers={"Authorization": header}).status_code == 200
    for header in ("bearer s3cre", "Basic s3cret", "s3cret", "bearers3cret"):
        assert client.get("/v1/models", headers={"Authorization": header}).status_code == 401


def test_the_grpc_token_check_takes_the_scheme_in_any_case() -> None:
    import asyncio

    from suffixd.daemon.server.auth import BearerTokenInterceptor

    handler = SimpleNamespace(request_streaming=False, response_streaming=False)
    interceptor = BearerTokenInterceptor("s3cret")

    def verdict(value: str) -> bool:
        async def continuation(details: Any) -> Any:
            return handler
        details = SimpleNamespace(method="/suffixd.v1.Suffixd/Info",
                                  invocation_metadata=[("authorization", value)])
        return asyncio.run(interceptor.intercept_service(continuation, details)) is handler

    assert verdict("Bearer s3cret") and verdict("bearer s3cret") and verdict("BEARER s3cret")
    assert not verdict("bearer wrong") and not verdict("Basic s3cret")


def test_the_daemon_refuses_web_pages_and_answers_its_names(http_daemon: Any,
                                                           daemon_factory: Any) -> None:
    """The two probes of issue 44 against a real daemon: a text/plain POST from another
    origin and a rebound Host; then --allowed-hosts."""
    base = http_daemon.proc.http.removesuffix("/v1")
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
    r = httpx.post(base + "/v1/chat/completions", content=body, timeout=30, headers={
        "Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    r = httpx.get(base + "/dashboard/history.json", timeout=30,
                  headers={"Host": "evil.example"})
    assert r.status_code == 403 and "DNS rebinding" in r.text
    port = base.rsplit(":", 1)[1]
    assert httpx.get(base + "/v1/models", timeout=30,
                     headers={"Host": f"localhost:{port}"}).status_code == 200
    proc = daemon_factory(args=["--http", "127.0.0.1:0", "--allowed-hosts", "agent.internal"])
    named = proc.http.removesuffix("/v1")
    assert httpx.get(named + "/v1/models", timeout=30,
                     headers={"Host": "agent.internal:80"}).status_code == 200
    assert httpx.get(named + "/v1/models", timeout=30,
                     headers={"Host": "evil.example"}).status_code == 403


# ------------------------------------------------------------ the finder, as a unit
def test_finder_follows_conversations_and_forks_on_divergence() -> None:
    f = SessionFinder()
    sys_ = {"role": "system", "content": "S"}
    m1 = [sys_, {"role": "user", "content": "q1"}]
    sid, found = f.claim("ns", m1)
    assert not found
    f.release("ns", sid, m1, "r1")
    m2 = [*m1, {"role": "assistant", "content": " r1\n"}, {"role": "user", "content": "q2"}]
    assert f.claim("ns", m2) == (sid, True)
    # while busy, an identical request opens its own session
    other, found = f.claim("ns", m2)
    assert other != sid and not found
    f.release("ns", other, None, None)
    f.release("ns", sid, m2, "r2")
    # a different namespace never matches
    assert not f.claim("other", m2)[1]
    # a retry of turn 2 after the session moved on forks
    assert f.claim("ns", m2)[0] != sid
    # the content parts form of the same history continues the session
    m3 = [*m2, {"role": "assistant", "content": [{"type": "text", "text": "r2"}]},
          {"role": "user", "content": "q3"}]
    assert f.claim("ns", m3) == (sid, True)


def test_finder_is_bounded() -> None:
    f = SessionFinder(max_entries=10)
    for i in range(50):
        m = [{"role": "user", "content": f"q{i}"}]
        sid, _ = f.claim("ns", m)
        f.release("ns", sid, m, f"r{i}")
    assert len(f) == 10
    kept = [{"role": "user", "content": "q49"}, {"role": "assistant", "content": "r49"},
            {"role": "user", "content": "more"}]
    assert f.claim("ns", kept)[1]
    dropped = [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "r0"},
               {"role": "user", "content": "more"}]
    assert not f.claim("ns", dropped)[1]


def test_automatic_sessions_end_by_namespace_bound_and_idle_time() -> None:
    ended: list[tuple[str, str]] = []
    f = SessionFinder(max_per_namespace=3, ttl_s=3600.0,
                      on_drop=lambda ns, sid: ended.append((ns, sid)))
    opened = []
    for i in range(5):
        m = [{"role": "user", "content": f"q{i}"}]
        sid, _ = f.claim("a", m)
        opened.append(sid)
        f.release("a", sid, m, f"r{i}")
    busy, _ = f.claim("b", [{"role": "user", "content": "other namespace"}])
    # the least recently used idle ones of the namespace ended, in order; "b" untouched
    assert ended == [("a", opened[0]), ("a", opened[1])]
    assert len(f) == 4
    # a busy session is never ended: with every session busy the bound waits
    ended.clear()
    g = SessionFinder(max_per_namespace=1, on_drop=lambda ns, sid: ended.append((ns, sid)))
    g.claim("a", [{"role": "user", "content": "x"}])
    g.claim("a", [{"role": "user", "content": "y"}])
    assert ended == []
    # idle past the timeout: ended at the next claim
    h = SessionFinder(ttl_s=0.0, on_drop=lambda ns, sid: ended.append((ns, sid)))
    m = [{"role": "user", "content": "z"}]
    sid, _ = h.claim("a", m)
    h.release("a", sid, m, "r")
    time.sleep(0.01)
    h.claim("a", [{"role": "user", "content": "next"}])
    assert ended == [("a", sid)]
    assert busy


def test_finder_follows_an_agent_that_rewrites_replies() -> None:
    """Agents resend a reply trimmed, re-serialised or replaced by a recorded one: the
    conversation before it still names the session, when no other session shares it."""
    f = SessionFinder()
    m1 = [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"}]
    sid, _ = f.claim("ns", m1)
    f.release("ns", sid, m1, "what the model said")
    m2 = [*m1, {"role": "assistant", "content": "what the agent kept"},
          {"role": "user", "content": "q2"}]
    assert f.claim("ns", m2) == (sid, True)
    f.release("ns", sid, m2, "second reply")
    m3 = [*m2, {"role": "assistant", "content": None,
                "tool_calls": [{"function": {"name": "run", "arguments": "{}"}}]},
          {"role": "tool", "content": "ok", "tool_call_id": "1"}]
    assert f.claim("ns", m3) == (sid, True)


def test_finder_never_guesses_between_identical_first_turns() -> None:
    f = SessionFinder()
    m1 = [{"role": "system", "content": "S"}, {"role": "user", "content": "q"}]
    a, _ = f.claim("ns", m1)
    f.release("ns", a, m1, "ra")
    b, _ = f.claim("ns", m1)
    f.release("ns", b, m1, "rb")
    assert a != b
    # the replies as served tell the two conversations apart...
    assert f.claim("ns", [*m1, {"role": "assistant", "content": "rb"},
                          {"role": "user", "content": "next"}]) == (b, True)
    assert f.claim("ns", [*m1, {"role": "assistant", "content": "ra"},
                          {"role": "user", "content": "next"}]) == (a, True)
    # ...a rewritten one cannot, so it opens a session of its own rather than guess
    sid, found = f.claim("ns", [*m1, {"role": "assistant", "content": "rewritten"},
                                {"role": "user", "content": "next"}])
    assert not found and sid not in (a, b)


def test_finder_follows_an_agent_that_drops_a_malformed_reply() -> None:
    """A text-mode agent that drops a reply it could not parse continues the session whose
    history its call extends without that turn: asking again with a word on why (rule 3),
    or after error messages answered with a reply it keeps alone (rule 4)."""
    f = SessionFinder()
    m1 = [{"role": "system", "content": "S"}, {"role": "user", "content": "task"}]
    sid, _ = f.claim("ns", m1)
    f.release("ns", sid, m1, "r1")
    m2 = [*m1, {"role": "assistant", "content": "r1"}, {"role": "user", "content": "out1"}]
    assert f.claim("ns", m2) == (sid, True)
    f.release("ns", sid, m2, "malformed")
    # rule 3: the malformed reply dropped, the prompt goes on with why
    m3 = [*m2, {"role": "user", "content": "your reply was malformed, try again"}]
    assert f.claim("ns", m3) == (sid, True)
    f.release("ns", sid, m3, "also malformed")
    # rule 4: the error and the bad reply resent, twice, then a reply that passes...
    m4 = [*m3, {"role": "assistant", "content": "also malformed"},
          {"role": "user", "content": "format error"}]
    assert f.claim("ns", m4) == (sid, True)
    f.release("ns", sid, m4, "still malformed")
    m5 = [*m4, {"role": "assistant", "content": "still malformed"},
          {"role": "user", "content": "format error"}]
    assert f.claim("ns", m5) == (sid, True)
    f.release("ns", sid, m5, "r2")
    # ...which the agent keeps alone, after the prompt of the turn (m2)
    m6 = [*m2, {"role": "assistant", "content": "r2"}, {"role": "user", "content": "out2"}]
    assert f.claim("ns", m6) == (sid, True)
    f.release("ns", sid, m6, "r3")
    # the turn resent as it was (a retry) still forks, and a first turn continues no
    # session whose latest prompt it does not go on from
    assert f.claim("ns", m6)[0] != sid
    assert not f.claim("ns", [*m1, {"role": "user", "content": "again"}])[1]
    # two sessions that could be meant: neither
    f2 = SessionFinder()
    for reply in ("xa", "xb"):
        other, found = f2.claim("ns", m2)
        assert not found
        f2.release("ns", other, m2, reply)
    assert not f2.claim("ns", [*m2, {"role": "user", "content": "again"}])[1]


def test_finder_follows_an_agent_that_drops_its_first_reply() -> None:
    """Issue 44, item 10: the first reply dropped (cut at the token limit), the agent asks
    again with a user message: no assistant message at all, yet the session goes on."""
    f = SessionFinder()
    system = {"role": "system", "content": "S"}
    m1 = [system, {"role": "user", "content": "task"}]
    sid, _ = f.claim("ns", m1)
    f.release("ns", sid, m1, "a reply cut at the limit")
    nudge = {"role": "user", "content": "Your previous response reached the output token "
                                        "limit. Answer shorter."}
    m2 = [*m1, nudge]
    assert f.claim("ns", m2) == (sid, True)
    f.release("ns", sid, m2, "cut again")
    # dropped twice: goes on from the latest prompt, by user messages only
    m3 = [*m2, {"role": "user", "content": "shorter still"}, nudge]
    assert f.claim("ns", m3) == (sid, True)
    f.release("ns", sid, m3, "done")
    # what is no extension by user messages opens a session of its own: the prompt sent
    # again (a retry forks), another system prompt after it, a prompt that shares only
    # the system message with the session's
    assert f.claim("ns", m3)[0] != sid
    assert not f.claim("ns", [*m3, {"role": "system", "content": "more"}])[1]
    assert not f.claim("ns", [system, {"role": "user", "content": "another task"}])[1]
    # a session whose prompt is a system message alone names no conversation
    g = SessionFinder()
    sid, _ = g.claim("ns", [system])
    g.release("ns", sid, [system], "r")
    assert not g.claim("ns", [system, {"role": "user", "content": "q"}])[1]
    # two sessions with that prompt: neither is guessed
    h = SessionFinder()
    for reply in ("ra", "rb"):
        other, _ = h.claim("ns", m1)
        h.release("ns", other, m1, reply)
    assert not h.claim("ns", m2)[1]


def test_an_agent_that_drops_a_reply_cut_at_the_limit_keeps_its_session(
        http_daemon: Any) -> None:
    """Issue 44, item 10, through the daemon: [system, user] answered with finish_reason
    'length', then the same two and a user message saying so (the reply dropped): the
    same session, its prompt's KV reused."""
    ns = "cut-reply"
    msgs = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Write the SQL for every singer, with a long comment "
                                        "on each column."}]
    r = http_daemon.oai.chat.completions.create(
        model="default", messages=msgs, max_tokens=3, temperature=0, extra_headers=ns_headers(ns))
    assert r.choices[0].finish_reason == "length"
    first = r.model_extra["suffixd"]
    assert not first["session_found"]
    again = [*msgs, {"role": "user", "content": "Your previous response reached the output "
                                                "token limit. Please answer shorter."}]
    _, extra, usage = _turn(http_daemon.oai, ns, again)
    assert extra["session_found"] and extra["session"] == first["session"]
    # all of the first prompt but its last tokens (where the new user turn starts)
    assert usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - 4, (
        usage, r.usage)
    assert [s.session_id for s in http_daemon.list_sessions(ns)] == [first["session"]]


def test_store_failures_map_to_openai_shaped_errors() -> None:
    """A full disk is a 429 the client can retry once space is freed (gRPC's
    RESOURCE_EXHAUSTED), not a 500; a closing store is a 503."""
    from suffixd.daemon.http_api.requests import api_error

    from suffixcache.store import DiskFullError, StoreClosedError

    full = api_error(DiskFullError("disk full: 12 KiB free under /data"))
    assert full.status == 429 and full.code == "disk_full"
    assert full.message.startswith("disk full")
    closing = api_error(StoreClosedError("closed"))
    assert closing.status == 503 and "shutting down" in closing.message


def test_the_daemon_ends_automatic_sessions_past_the_namespace_bound(tmp_path: Any) -> None:
    """Through the real daemon: with room for 2 automatic sessions per namespace, a third
    new conversation ends the least recently used one (closed, its response kept in the
    global tree); a conversation that named its session is never ended."""
    from tests.conftest import DaemonProcess

    proc = DaemonProcess(tmp_path / "data", ["--http", "127.0.0.1:0"],
                         env={"SUFFIXD_AUTO_SESSIONS_PER_NAMESPACE": "2"}).start()
    try:
        def chat(q: str, **headers: str) -> dict[str, Any]:
            r = httpx.post(f"{proc.http}/chat/completions", timeout=900, headers={
                "X-Suffixd-Namespace": "auto", **headers}, json={
                "model": "default", "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": q}]})
            assert r.status_code == 200, r.text
            return r.json()

        named = chat("a named one", **{"X-Suffixd-Session": "mine"})["suffixd"]["session"]
        first = [chat(f"question {i}")["suffixd"]["session"] for i in range(3)]
        client = proc.client()
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                open_ids = {s.session_id for s in client.list_sessions("auto")}
                if first[0] not in open_ids:
                    break
                time.sleep(0.2)
            assert open_ids == {named, first[1], first[2]}, (open_ids, first)
            ns = client.stats("auto")["namespaces"][0]
            assert ns["global"]["sequences"] == 4  # every response kept, the ended one too
        finally:
            client.close()
    finally:
        proc.stop()
