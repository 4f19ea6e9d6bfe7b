"""Deferred steps coalesced into one store write per session and commit group
(engine/session_state.py: DeferredBatch): order, truthful durable_tokens, and restore after
a crash."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from suffixd.daemon.engine import Engine

from suffixcache.store import Store

VOCAB = 262144


def _hold_writer(engine: Engine) -> threading.Event:
    """Keep the store's writer busy inside a transaction until the event is set, so the
    writes queued meanwhile form the next commit group."""
    release = threading.Event()
    started = threading.Event()

    def block(_t: Any) -> None:
        started.set()
        release.wait(30)

    engine.store.submit(block)
    assert started.wait(10)
    return release


def test_deferred_steps_share_one_write_and_keep_their_order(tmp_path: Path) -> None:
    with Engine(tmp_path, vocab_size=VOCAB, sync=False) as e:
        e.open_session("ns", "s", tokens=[1, 2, 3])
        sess = e.stream_session("ns", "s")
        release = _hold_writer(e)
        commits = e.store.commits
        e.step(sess, "generated", [10, 11], draft=False, defer_commit=True)
        e.step(sess, "generated", [12], draft=False, defer_commit=True)
        e.step(sess, "tool", [20, 21], draft=False, defer_commit=True)
        e.step(sess, "generated", [13], draft=False, defer_commit=True)
        first = sess.last_commit
        assert sess.durable_tokens == 3  # nothing of this is committed yet
        assert sess.rec["tokens"] == 9 and sess.batch is not None
        # A durable append ends the batch (it holds the session until committed): the
        # queued write must not grow past it.
        durable = threading.Thread(target=e.append, args=("ns", "s", "prompt", [30]))
        durable.start()
        deadline = time.monotonic() + 10
        while sess.batch is not None and time.monotonic() < deadline:
            time.sleep(0.001)
        assert sess.batch is None
        release.set()
        durable.join(10)
        assert sess.durable_tokens == 10 and first.done()
        e.step(sess, "generated", [14], draft=False, defer_commit=True)
        assert sess.last_commit is not first  # a new batch
        e.wait_commits(sess)
        assert sess.durable_tokens == sess.rec["tokens"] == 3 + 6 + 1 + 1
        # The held group, the coalesced batch (with the durable append in the same
        # group or the next), then the step after the append: at most 4 commits.
        assert e.store.commits - commits <= 4
        chunks = e.store.session_chunks("ns", "s")
        assert chunks == [("prompt", [1, 2, 3]), ("generated", [10, 11, 12]), ("tool", [20, 21]),
                          ("generated", [13]), ("prompt", [30]), ("generated", [14])]
        assert e.store.get_session("ns", "s")["chunks"] == len(chunks)
        assert e.session_tail("ns", "s", 11) == [1, 2, 3, 10, 11, 12, 20, 21, 13, 30, 14]


_CRASH = textwrap.dedent("""
    import json, os, sys, threading
    from suffixd.daemon.engine import Engine
    e = Engine(sys.argv[1], vocab_size=262144, sync=True)
    e.open_session("ns", "s", tokens=[1, 2, 3])
    sess = e.stream_session("ns", "s")
    release, started = threading.Event(), threading.Event()
    def block(_t):
        started.set()
        release.wait(30)
    e.store.submit(block)
    started.wait(10)
    steps = [[100 + i] for i in range(50)] + [[200, 201]]
    for i, toks in enumerate(steps):
        e.step(sess, "tool" if i == 50 else "generated", toks, draft=False, defer_commit=True)
    release.set()
    e.wait_commits(sess)
    # Write a last batch that is never waited for, then die as kill -9 would: no close,
    # no flush.
    e.step(sess, "generated", [300], draft=False, defer_commit=True)
    print(json.dumps({"durable": sess.durable_tokens, "commits": e.store.commits}), flush=True)
    os._exit(0)
""")


def test_coalesced_group_survives_a_crash(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _CRASH, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    acked = [1, 2, 3] + [100 + i for i in range(50)] + [200, 201]
    assert res["durable"] == len(acked)  # what the replies would have reported
    with Store(tmp_path / "store") as store:
        chunks = store.session_chunks("ns", "s")
        rec = store.get_session("ns", "s")
    toks = [t for _, c in chunks for t in c]
    # Every acknowledged step is back; the unacknowledged last one may or may not be.
    assert toks[: len(acked)] == acked and toks[len(acked):] in ([], [300])
    # 51 steps, coalesced: the prompt, one generated chunk and one tool chunk.
    assert [k for k, _ in chunks[:3]] == ["prompt", "generated", "tool"]
    assert rec["tokens"] == len(toks) and rec["chunks"] == len(chunks)
    # The restarted engine serves the session with all of it.
    with Engine(tmp_path, vocab_size=VOCAB) as e:
        assert e.session_tail("ns", "s", len(toks)) == toks
        assert e.stream_session("ns", "s").durable_tokens == len(toks)
