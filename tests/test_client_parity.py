"""The asyncio client offers what the sync client offers, and both build the same requests."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from suffixd.client import AsyncClient, AsyncSession, AsyncStepper, Client, Session, Stepper
from suffixd.client import requests as rq

PAIRS = [(Client, AsyncClient), (Session, AsyncSession), (Stepper, AsyncStepper)]
# Sync-only spellings of the same thing: the context-manager protocol.
_PROTOCOL = {"__enter__": "__aenter__", "__exit__": "__aexit__"}


def _public(cls: type) -> dict[str, Any]:
    return {
        name: fn for name, fn in inspect.getmembers(cls, callable)
        if (not name.startswith("_") or name in _PROTOCOL) and name not in ("mro",)
    }


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_every_public_sync_method_has_an_async_twin(sync_cls: type, async_cls: type) -> None:
    sync, aio = _public(sync_cls), _public(async_cls)
    assert sync, "nothing public found: the comparison would be empty"
    missing = []
    for name, fn in sync.items():
        twin = getattr(async_cls, _PROTOCOL.get(name, name), None)
        if twin is None:
            missing.append(name)
            continue
        # Same parameters, same names and defaults (what a caller writes must carry over).
        ps, pa = inspect.signature(fn).parameters, inspect.signature(twin).parameters
        assert [(p.name, p.kind, p.default) for p in ps.values()] == \
               [(p.name, p.kind, p.default) for p in pa.values()], name
    assert not missing, f"{async_cls.__name__} lacks {missing}"
    # And nothing async-only that a sync user would miss either.
    extra = {n for n in aio if n not in sync and n not in _PROTOCOL.values()}
    assert not extra, f"{sync_cls.__name__} lacks {sorted(extra)}"


def test_async_session_opens_both_ways() -> None:
    """``async with client.session()`` and ``async with await client.session()`` both work
    (the README shows the first): checked without a daemon through a stub open_session."""
    from suffixd.client.types import SessionInfo

    class FakeClient(AsyncClient):
        def __init__(self) -> None:
            self.cost_profile = "flat"
            self.closed: list[str] = []

        async def open_session(self, namespace: str = "default", session_id: str | None = None,
                               *args: Any, **kw: Any) -> SessionInfo:
            return SessionInfo(namespace, session_id or "s1", {}, 0, 0.0, 0.0, 0)

        async def close_session(self, namespace: str, session_id: str,
                                keep_responses: bool = True) -> dict[str, Any]:
            self.closed.append(session_id)
            return {}

    async def main() -> FakeClient:
        c = FakeClient()
        async with c.session("ns", "a") as s:
            assert isinstance(s, AsyncSession) and s.id == "a"
        async with await c.session("ns", "b") as s:
            assert s.id == "b"
        s = await c.session("ns", "c")  # left open
        assert not s.closed
        return c

    assert asyncio.run(main()).closed == ["a", "b"]


def test_cost_profiles_resolve() -> None:
    from suffixcache.cost import CPU_DEFAULT_POINTS

    assert rq.resolve_cost_profile("cpu") == CPU_DEFAULT_POINTS
    assert rq.resolve_cost_profile("daemon") is None and rq.resolve_cost_profile(None) is None
    flat = rq.resolve_cost_profile("flat")
    assert flat and set(flat.values()) == {1.0}
    assert rq.resolve_cost_profile({"1": 1, "8": 2.5}) == {1: 1.0, 8: 2.5}
    with pytest.raises(ValueError, match="cost_profile"):
        rq.resolve_cost_profile("gpu-ish")
    with pytest.raises(ValueError, match="cost_profile"):
        Client("unix:/nonexistent.sock", cost_profile="fast")
    req = rq.speculate_request("ns", "s", [1, 2], 8, "cpu")
    assert dict(zip(req.cost_profile.k, req.cost_profile.cost, strict=True)) == CPU_DEFAULT_POINTS
    assert not rq.speculate_request("ns", "s", None, 8, "daemon").HasField("cost_profile")
    step = rq.step_request("ns", "s", True, [5], 4, "flat", "prompt", True, False)
    assert step.namespace == "ns" and list(step.append) == [5] and step.cost_profile.k
    later = rq.step_request("ns", "s", False, [6], 4, None, "generated", True, False)
    assert not later.namespace and not later.HasField("cost_profile")


def test_requests_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="kind"):
        rq.append_request("ns", "s", "answer", [1], None)
    with pytest.raises(ValueError, match="exactly one"):
        rq.append_request("ns", "s", "prompt", [1], "text")
    with pytest.raises(ValueError, match="exactly one"):
        rq.generate_request("s", prompt="a", tokens=[1])
    with pytest.raises(ValueError, match="role, content"):
        rq.generate_request("s", messages=[{"content": "hi"}])
    g = rq.generate_request(None, messages=[{"role": "user", "content": "hi"}], seed=3)
    assert g.session_id == "" and g.seed == 3 and g.messages.messages[0].role == "user"
