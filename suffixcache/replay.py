"""The replay protocol: acceptance of a draft source on recorded agent sessions, without a model.

Implements `../shared/data/README.md` ("Replay protocol"): sessions in file
order with state carried over; each assistant turn is "generated" step by
step: the source drafts from the context (prompt + generated so far), the
longest prefix of a draft path equal to the recorded response is accepted plus
one bonus token, and the next step begins. Costs come from a verifier cost
profile.

The tokenizer is the caller's business (the CLI loads a GGUF vocabulary): this
module only sees token ids, so it stays free of llama.cpp.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from suffixcache.cache import SuffixCache
from suffixcache.cost import CostProfile
from suffixcache.drafter import Draft, DraftConfig, Drafter


@dataclass(frozen=True)
class Message:
    role: str
    header: list[int]  # tokenize("<" + role + ">\n")
    content: list[int]  # tokenize(content)


@dataclass(frozen=True)
class Session:
    name: str
    messages: list[Message]


class DraftSource(Protocol):
    """What the replay drives: one source of drafts (suffixd, prompt lookup, ...)."""

    name: str

    def begin_session(self, key: str) -> None: ...
    def append(self, key: str, tokens: Sequence[int], *, generated: bool) -> None: ...
    def propose(self, key: str, context: list[int], max_tokens: int) -> Draft: ...
    # accepted_tokens: the accepted draft tokens, then the verifier's own next token
    def observe(self, draft: Draft, accepted: int, accepted_tokens: Sequence[int]) -> None: ...
    def end_turn(self, key: str, response: Sequence[int]) -> None: ...
    def end_session(self, key: str) -> None: ...
    def memory(self) -> dict[str, int]: ...


class SuffixSource:
    """suffixd's own drafting: session tree + global tree through the Drafter."""

    name = "suffixd"

    def __init__(
        self,
        cost_profile: CostProfile,
        config: DraftConfig | None = None,
        *,
        namespace: str = "replay",
        max_depth: int = 64,
        global_budget_tokens: int = 50_000_000,
    ) -> None:
        self.cache = SuffixCache(max_depth=max_depth, global_budget_tokens=global_budget_tokens)
        self.drafter = Drafter(self.cache, config, cost_profile)
        self.namespace = namespace
        self._next_response = 0

    def begin_session(self, key: str) -> None:
        self.cache.open_session(self.namespace, key)

    def append(self, key: str, tokens: Sequence[int], *, generated: bool) -> None:
        self.cache.append_session(self.namespace, key, tokens)

    def propose(self, key: str, context: list[int], max_tokens: int) -> Draft:
        return self.drafter.propose(self.namespace, key, context, max_tokens)

    def observe(self, draft: Draft, accepted: int, accepted_tokens: Sequence[int]) -> None:
        self.drafter.observe(draft, accepted, accepted_tokens)

    def end_turn(self, key: str, response: Sequence[int]) -> None:
        self._next_response += 1
        self.cache.add_response(self.namespace, self._next_response, response)

    def end_session(self, key: str) -> None:
        self.cache.close_session(self.namespace, key)

    def memory(self) -> dict[str, int]:
        stats = self.cache.stats(self.namespace).get(self.namespace)
        if not stats:
            return {"tokens": 0, "bytes": 0, "nodes": 0}
        g, s = stats["global"], stats["sessions"]
        return {
            "tokens": g["tokens"] + s["tokens"],
            "bytes": g["bytes"] + s["bytes"],
            "nodes": g["nodes"] + s["nodes"],
        }


@dataclass
class ReplayResult:
    source: str
    sessions: int = 0
    turns: int = 0
    out_tokens: int = 0
    steps: int = 0
    accepted: int = 0
    proposed: int = 0
    cost: float = 0.0
    spec_ns: int = 0
    update_ns: int = 0
    update_tokens: int = 0
    index_ns: int = 0  # appending prompts (non-generated messages) to the session
    index_tokens: int = 0
    steps_with_draft: int = 0
    memory: dict[str, int] = field(default_factory=dict)

    def figures(self) -> dict[str, float | int | str]:
        steps = max(self.steps, 1)
        mem_tokens = self.memory.get("tokens", 0)
        return {
            "source": self.source,
            "sessions": self.sessions,
            "turns": self.turns,
            "out_tokens": self.out_tokens,
            "steps": self.steps,
            "tokens_per_step": self.out_tokens / steps,
            "accepted_per_step": self.accepted / steps,
            "spec_per_step": self.proposed / steps,
            "accept_rate": self.accepted / max(self.proposed, 1),
            "draft_hit_rate": self.steps_with_draft / steps,
            "cpu_model_speedup": self.out_tokens / max(self.cost, 1e-9),
            "spec_us_per_call": self.spec_ns / 1e3 / steps,
            "update_us_per_token": self.update_ns / 1e3 / max(self.update_tokens, 1),
            "index_us_per_prompt_token": self.index_ns / 1e3 / max(self.index_tokens, 1),
            "index_ms_per_request": self.index_ns / 1e6 / max(self.turns, 1),
            "cached_tokens": mem_tokens,
            "bytes_per_cached_token": self.memory.get("bytes", 0) / max(mem_tokens, 1),
        }


def replay(
    sessions: Iterable[Session],
    source: DraftSource,
    cost_profile: CostProfile,
    *,
    max_spec: int = 32,
    on_turn: Callable[[int], object] | None = None,
) -> ReplayResult:
    """Runs the replay protocol over sessions (in order, state carried over)."""
    res = ReplayResult(source=source.name)
    cost = cost_profile.table(max_spec + 1)
    clock = time.perf_counter_ns
    for session in sessions:
        res.sessions += 1
        key = f"{res.sessions}:{session.name}"
        source.begin_session(key)
        context: list[int] = []
        for msg in session.messages:
            if msg.role != "assistant":
                toks = msg.header + msg.content
                t0 = clock()
                source.append(key, toks, generated=False)
                res.index_ns += clock() - t0
                res.index_tokens += len(toks)
                context.extend(toks)
                continue
            t0 = clock()
            source.append(key, msg.header, generated=False)
            res.index_ns += clock() - t0
            res.index_tokens += len(msg.header)
            context.extend(msg.header)
            response = msg.content
            pos = 0
            while pos < len(response):
                t0 = clock()
                draft = source.propose(key, context, max_spec)
                res.spec_ns += clock() - t0
                truth = response[pos:]
                accepted = draft.accepted_length(truth)
                # the accepted tokens and the verifier's own next token (the bonus)
                source.observe(draft, accepted, truth[: accepted + 1])
                new = truth[: accepted + 1]
                t0 = clock()
                source.append(key, new, generated=True)
                res.update_ns += clock() - t0
                res.update_tokens += len(new)
                context.extend(new)
                pos += len(new)
                n_draft = len(draft.tokens)
                res.steps += 1
                res.steps_with_draft += n_draft > 0
                res.proposed += n_draft
                res.accepted += accepted
                res.cost += (
                    cost[n_draft + 1] if n_draft + 1 < len(cost) else cost_profile.cost(n_draft + 1)
                )
            t0 = clock()
            source.end_turn(key, response)
            res.update_ns += clock() - t0
            res.update_tokens += len(response)
            res.turns += 1
            res.out_tokens += len(response)
            if on_turn is not None:
                on_turn(len(response))
        # sample memory while the session (the largest tree) is still alive
        mem = source.memory()
        if mem.get("bytes", 0) >= res.memory.get("bytes", 0):
            res.memory = mem
        source.end_session(key)
    return res
