"""Which session an OpenAI chat request continues, when it does not say.

An agent resends its whole conversation every turn: turn n+1's messages are turn n's
messages, then the assistant reply turn n received, then new user/tool messages. So the
finder remembers, for every reply it served, a digest of the conversation up to and
including that reply (a hash chain over the namespace and the canonical messages). A new
request continues session S when the longest prefix of its messages that ends with an
assistant message has the digest of S's latest reply, and S is not busy with another
request. Otherwise it opens a new session. Hence:

* parallel conversations in any interleaving each follow their own session, because
  every digest covers the whole history up to a reply;
* two conversations that merely share a system prompt (or even a first user message)
  never meet: a first turn has no assistant message and always opens a new session;
* two conversations identical up to a reply (the same prompts, the same greedy reply)
  are indistinguishable by content: the first to send its next turn continues the
  session, the other finds the session moved on (or busy) and gets a new one. No
  conversation ever sees another's tokens it did not itself send.

Canonical messages: role, the text content (content parts joined, surrounding
whitespace stripped, since clients trim replies), a tool call's name and arguments,
``name`` and ``tool_call_id``. Memory is bounded: at most ``max_entries`` sessions,
least recently used dropped first, and entries idle longer than ``ttl_s``.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


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


def _canonical(message: Mapping[str, Any]) -> bytes:
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
        h = hashlib.blake2b(h + _canonical(m), digest_size=16).digest()
        out.append(h)
    return out


@dataclass
class _Entry:
    session_id: str
    head: bytes | None  # digest of the conversation up to the session's latest reply
    busy: bool = False
    last: float = 0.0


class SessionFinder:
    """Thread-safe: ``claim`` a session for a request, ``release`` it with the reply."""

    def __init__(self, max_entries: int = 100_000, ttl_s: float = 24 * 3600.0,
                 prefix: str = "chat-") -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.prefix = prefix
        self._lock = threading.Lock()
        self._by_session: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._by_head: dict[tuple[str, bytes], tuple[str, str]] = {}
        self.found = 0  # requests that continued a session
        self.opened = 0  # requests that opened one

    def claim(self, namespace: str, messages: Sequence[Mapping[str, Any]]) -> tuple[str, bool]:
        """The session for this request, marked busy until ``release``: (id, continued)."""
        ds = digests(namespace, messages)
        now = time.monotonic()
        with self._lock:
            self._expire(now)
            for i in range(len(messages) - 1, -1, -1):
                if messages[i].get("role") != "assistant":
                    continue
                key = self._by_head.get((namespace, ds[i]))
                if key is None:
                    continue
                entry = self._by_session.get(key)
                if entry is None or entry.busy or entry.head != ds[i]:
                    continue
                entry.busy = True
                entry.last = now
                self._by_session.move_to_end(key)
                self.found += 1
                return key[1], True
            sid = self.prefix + secrets.token_hex(8)
            self._by_session[(namespace, sid)] = _Entry(sid, None, busy=True, last=now)
            self.opened += 1
            while len(self._by_session) > self.max_entries:
                self._drop(next(iter(self._by_session)))
            return sid, False

    def release(self, namespace: str, session_id: str,
                messages: Sequence[Mapping[str, Any]] | None, reply: str | None) -> None:
        """The request ended. With its messages and the reply it got, the session's head
        moves to the conversation after that reply; without (an error, a disconnect) the
        session keeps its previous head, so a retry of the same turn continues it."""
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
            head = digests(namespace, [*messages, {"role": "assistant", "content": reply}])[-1]
            if entry.head is not None:
                self._by_head.pop((namespace, entry.head), None)
            entry.head = head
            self._by_head[(namespace, head)] = key

    def forget(self, namespace: str, session_id: str) -> None:
        with self._lock:
            self._drop((namespace, session_id))

    def __len__(self) -> int:
        return len(self._by_session)

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self._by_session.pop(key, None)
        if (entry is not None and entry.head is not None
                and self._by_head.get((key[0], entry.head)) == key):
            del self._by_head[(key[0], entry.head)]

    def _expire(self, now: float) -> None:
        while self._by_session:
            key, entry = next(iter(self._by_session.items()))
            if now - entry.last <= self.ttl_s or entry.busy:
                break
            self._drop(key)
