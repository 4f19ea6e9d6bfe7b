"""Which session an OpenAI chat request continues, when it does not say.

An agent resends its whole conversation every turn: turn n+1's messages are turn n's
messages, then an assistant message (the reply turn n received, or the agent's own
rewrite of it: trimmed, tool calls re-serialised, a recorded trace's answer), then new
user/tool messages. The finder keeps, per session, two digests of its latest request (a
hash chain over the namespace and the canonical messages): of the request's messages
(the *prompt head*) and of those messages plus the reply served (the *reply head*). A
new request continues session S when, at its last assistant message:

1. the conversation up to and including that message has S's reply head (the agent
   resent the reply as served), or
2. the conversation before that message has S's prompt head, and no other session has
   that prompt head (the agent rewrote the reply, but the conversation is unambiguous), or
3. the conversation goes on from S's prompt head after that message, with no reply in
   between, and no other session has that prompt head (the agent dropped the reply it
   was served, a malformed one, and asks again with a word on why), or
4. the conversation up to and including that message is S's reply served after one of
   S's recent earlier prompts (``_BASES``), and no other session's is (the agent dropped
   the turns in between: text-mode coding agents answer a malformed reply with an
   error message, and once a reply passes they keep it alone, dropping the malformed
   replies and the error messages from their history);

and S is not busy with another request. A request without an assistant message continues
S by rule 3 alone: when it goes on from S's prompt head, which held a user message, by
user messages only (the agent dropped S's first reply, e.g. one cut at the token limit,
and asks again). Otherwise it opens a new session. Hence:

* parallel conversations in any interleaving each follow their own session, because
  every digest covers the whole history;
* a first turn (no assistant message, and no session's prompt it goes on from) opens a
  new session, so two conversations that merely share a system prompt (or even a first
  user message) never meet: after one turn each, their prompt heads are equal, the rule
  2 and 3 matches are ambiguous, and only their replies (rule 1) tell them apart;
* two conversations identical up to a reply that the agents rewrite alike are
  indistinguishable by content; the first to send its next turn continues the session
  and the other gets a new one. No conversation ever sees tokens it did not send: a
  session's tree only drafts what the trees hold, and the output is lossless anyway.

Canonical messages: role, the text content (content parts joined, surrounding
whitespace stripped, since clients trim replies), a tool call's name and arguments,
``name`` and ``tool_call_id``. Memory is bounded: at most ``max_entries`` sessions,
least recently used dropped first, and entries idle longer than ``ttl_s``.

The sessions it opens end: one idle longer than ``ttl_s`` (an hour by default, shorter
than a named session's), or the least recently used idle one of a namespace holding more
than ``max_per_namespace``, is dropped and handed to ``on_drop`` (the app closes it, its
responses kept in the global tree), so an agent running for weeks never meets the
namespace's open-session limit.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Automatic sessions (a chat request that names none): idle timeout and how many one
# namespace keeps open (README, limits).
AUTO_SESSION_IDLE_S = 3600.0
AUTO_SESSIONS_PER_NAMESPACE = 1000
# The prompt heads a session keeps (its latest requests', latest first) for rule 4: an
# agent that drops its malformed replies and the error messages sent back after them
# (SWE-agent asks again up to 3 times) goes on from the first of these requests.
_BASES = 4


def message_text(content: Any) -> str:
    """The text of an OpenAI message content: a string, None, or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") in ("text", "input_text"):
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def canonical_message(message: Mapping[str, Any]) -> bytes:
    calls = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {} if isinstance(call, Mapping) else {}
        calls.append([str(fn.get("name", "")), str(fn.get("arguments", ""))])
    return json.dumps(
        [
            str(message.get("role", "")),
            message_text(message.get("content")).strip(),
            calls,
            str(message.get("name") or ""),
            str(message.get("tool_call_id") or ""),
        ],
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode("utf-8")


def digests(namespace: str, messages: Sequence[Mapping[str, Any]]) -> list[bytes]:
    """digests[i]: the conversation's digest after messages[:i + 1]."""
    h = hashlib.blake2b(namespace.encode("utf-8"), digest_size=16).digest()
    out = []
    for m in messages:
        h = _chain(h, m)
        out.append(h)
    return out


def _first_turn_floor(messages: Sequence[Mapping[str, Any]]) -> int:
    """For a request without an assistant message: the shortest prompt head it may go on
    from by rule 3. The head holds a user message (a system prompt alone names no
    conversation) and only user messages follow it (what an agent adds after a reply it
    dropped)."""
    first_user = next((i for i, m in enumerate(messages) if m.get("role") == "user"),
                      len(messages))
    tail = len(messages)
    while tail > 0 and messages[tail - 1].get("role") == "user":
        tail -= 1
    return max(first_user, tail - 1)


def _chain(head: bytes, message: Mapping[str, Any]) -> bytes:
    """The digest of the conversation ``head`` followed by ``message``."""
    return hashlib.blake2b(head + canonical_message(message), digest_size=16).digest()


@dataclass
class _Entry:
    session_id: str
    prompt_head: bytes | None = None  # digest of the latest request's messages
    reply_head: bytes | None = None  # ... and of the reply it was served
    # the prompt heads of its latest requests (latest first, the prompt head included),
    # and its latest reply after each earlier one (rule 4)
    bases: tuple[bytes, ...] = ()
    dropped_heads: tuple[bytes, ...] = ()
    busy: bool = False
    last: float = 0.0


class SessionFinder:
    """Thread-safe: ``claim`` a session for a request, ``release`` it with the reply."""

    def __init__(self, max_entries: int = 100_000, ttl_s: float = AUTO_SESSION_IDLE_S,
                 prefix: str = "chat-", max_per_namespace: int = AUTO_SESSIONS_PER_NAMESPACE,
                 on_drop: Callable[[str, str], None] | None = None) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.prefix = prefix
        self.max_per_namespace = max_per_namespace
        self.on_drop = on_drop
        self._per_ns: dict[str, int] = {}
        self._dropped: list[tuple[str, str]] = []  # to hand to on_drop, outside the lock
        self._lock = threading.Lock()
        self._by_session: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._by_reply: dict[tuple[str, bytes], tuple[str, str]] = {}
        self._by_prompt: dict[tuple[str, bytes], set[tuple[str, str]]] = {}
        self._by_dropped: dict[tuple[str, bytes], set[tuple[str, str]]] = {}
        self.found = 0  # requests that continued a session
        self.opened = 0  # requests that opened one

    def claim(self, namespace: str, messages: Sequence[Mapping[str, Any]]) -> tuple[str, bool]:
        """The session for this request, marked busy until ``release``: (id, continued)."""
        try:
            return self._claim(namespace, messages)
        finally:
            self._hand_over()

    def _claim(self, namespace: str, messages: Sequence[Mapping[str, Any]]) -> tuple[str, bool]:
        ds = digests(namespace, messages)
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"),
                       default=-1)
            key = self._match(namespace, ds, last, _first_turn_floor(messages))
            if key is not None:
                entry = self._by_session[key]
                entry.busy = True
                entry.last = now
                self._by_session.move_to_end(key)
                self.found += 1
                return key[1], True
            sid = self.prefix + secrets.token_hex(8)
            self._by_session[(namespace, sid)] = _Entry(sid, busy=True, last=now)
            self._per_ns[namespace] = self._per_ns.get(namespace, 0) + 1
            self.opened += 1
            while len(self._by_session) > self.max_entries:
                self._drop(next(iter(self._by_session)), closing=True)
            if self._per_ns[namespace] > self.max_per_namespace:
                idle = next((k for k, e in self._by_session.items()
                             if k[0] == namespace and not e.busy), None)
                if idle is not None:
                    self._drop(idle, closing=True)
            return sid, False

    def _hand_over(self) -> None:
        with self._lock:
            dropped, self._dropped = self._dropped, []
        if self.on_drop is not None:
            for ns, sid in dropped:
                self.on_drop(ns, sid)

    def _match(self, ns: str, ds: list[bytes], at: int, floor: int) -> tuple[str, str] | None:
        """The session the conversation ``ds`` continues, by the rules of the module
        docstring in their order; ``at``: its last assistant message (-1: none), ``floor``:
        without one, the shortest prompt head rule 3 may continue."""
        if at < 0:
            for j in range(len(ds) - 2, floor - 1, -1):
                if (key := self._only(ns, ds[j], self._by_prompt)) is not None:
                    return key
            return None
        key = self._by_reply.get((ns, ds[at]))
        if key is not None:
            entry = self._by_session.get(key)
            if entry is not None and not entry.busy and entry.reply_head == ds[at]:
                return key
        if at > 0 and (key := self._only(ns, ds[at - 1], self._by_prompt)) is not None:
            return key
        # Rule 3, from the longest: the prompt goes on past S's with no reply of S's; a
        # resent prompt with nothing after it is a retry of the turn, which forks.
        for j in range(len(ds) - 2, at - 1, -1):
            if (key := self._only(ns, ds[j], self._by_prompt)) is not None:
                return key
        return self._only(ns, ds[at], self._by_dropped)

    def _only(self, ns: str, head: bytes,
              index: dict[tuple[str, bytes], set[tuple[str, str]]]) -> tuple[str, str] | None:
        """The one session ``index`` holds for ``head``, when it is not busy."""
        keys = index.get((ns, head), set())
        if len(keys) != 1:
            return None  # nobody, or ambiguous: only the reply could tell them apart
        (key,) = keys
        entry = self._by_session.get(key)
        if entry is None or entry.busy:
            return None
        return key

    def release(self, namespace: str, session_id: str,
                messages: Sequence[Mapping[str, Any]] | None,
                reply: str | Mapping[str, Any] | None) -> None:
        """The request ended. With its messages and the reply it got (its text, or the
        assistant message with its tool calls), the session's heads
        move to this request; without (an error, a disconnect) they stay where they were,
        so a retry of the same turn continues the session."""
        key = (namespace, session_id)
        with self._lock:
            entry = self._by_session.get(key)
            if entry is None:
                return
            entry.busy = False
            entry.last = time.monotonic()
            self._by_session.move_to_end(key)
            if messages is None or reply is None:
                return
            message = {"role": "assistant", "content": reply} if isinstance(reply, str) \
                else reply
            ds = digests(namespace, [*messages, message])
            self._unindex(key, entry)
            entry.prompt_head, entry.reply_head = ds[-2], ds[-1]
            entry.bases = (ds[-2], *entry.bases)[:_BASES]
            entry.dropped_heads = tuple(_chain(b, message) for b in entry.bases[1:])
            self._by_reply[(namespace, entry.reply_head)] = key
            self._by_prompt.setdefault((namespace, entry.prompt_head), set()).add(key)
            for head in entry.dropped_heads:
                self._by_dropped.setdefault((namespace, head), set()).add(key)

    def forget(self, namespace: str, session_id: str) -> None:
        with self._lock:
            self._drop((namespace, session_id))

    def __len__(self) -> int:
        return len(self._by_session)

    def _unindex(self, key: tuple[str, str], entry: _Entry) -> None:
        ns = key[0]
        if entry.reply_head is not None and self._by_reply.get((ns, entry.reply_head)) == key:
            del self._by_reply[(ns, entry.reply_head)]
        heads = [(self._by_prompt, entry.prompt_head)] if entry.prompt_head is not None else []
        heads += [(self._by_dropped, head) for head in entry.dropped_heads]
        for index, head in heads:
            keys = index.get((ns, head))
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[(ns, head)]

    def _drop(self, key: tuple[str, str], closing: bool = False) -> None:
        entry = self._by_session.pop(key, None)
        if entry is not None:
            self._unindex(key, entry)
            n = self._per_ns.get(key[0], 1) - 1
            if n:
                self._per_ns[key[0]] = n
            else:
                self._per_ns.pop(key[0], None)
            if closing:
                self._dropped.append(key)

    def _expire(self, now: float) -> None:
        while self._by_session:
            key, entry = next(iter(self._by_session.items()))
            if now - entry.last <= self.ttl_s or entry.busy:
                break
            self._drop(key, closing=True)
