"""Engine in-process (no gRPC): restart rebuild in the background, acceptance counting."""

from __future__ import annotations

import random
import time
from pathlib import Path

from suffixd.daemon.engine import Engine
from suffixd.daemon.engine.drafting import accepted_along as _accepted_along


def _seqs(seed: int, n: int, length: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, 200_000) for _ in range(length)] for _ in range(n)]


def test_background_rebuild_serves_at_once_and_does_not_resurrect(tmp_path: Path) -> None:
    old = _seqs(1, 3000, 64)  # ~190k tokens: the rebuild takes a noticeable moment
    dropped = _seqs(2, 5, 32)
    with Engine(tmp_path, vocab_size=262144, sync=False) as e:
        e.open_session("ns", "bulk")
        e.append_many([("ns", "bulk", "response", s) for s in old])
        e.close_session("ns", "bulk")
        e.open_session("ns", "doomed")
        for s in dropped:
            e.append("ns", "doomed", "response", s)
    e = Engine(tmp_path, vocab_size=262144, background_rebuild=True)
    try:
        assert e.rebuilding  # serving while the trees fill in
        # Live work during the rebuild: a removal must stick, a new response must not clash.
        e.close_session("ns", "doomed", keep_responses=False)
        new = _seqs(3, 1, 40)[0]
        e.open_session("ns", "live")
        e.append("ns", "live", "response", new)
        deadline = time.monotonic() + 60
        while e.rebuilding and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not e.rebuilding and e.rebuild_seconds > 0
        st = e.stats("ns")["ns"]["cache"]["global"]
        assert st["sequences"] == len(old) + 1
        for s in dropped:
            d = e.propose("ns", None, s[:8], max_tokens=8)
            assert not set(d.tokens) & set(s[8:])
        d = e.propose("ns", None, old[-1][:8], max_tokens=8)
        assert len(d) >= 1 and d.tokens == old[-1][8: 8 + len(d)]
    finally:
        e.close()


def test_accepted_along_path_and_tree() -> None:
    class D:
        def __init__(self, tokens: list[int], parents: list[int]) -> None:
            self.tokens, self.parents = tokens, parents

    path = D([5, 6, 7, 8], [-1, 0, 1, 2])
    assert _accepted_along(path, [5, 6, 9]) == 2
    assert _accepted_along(path, [5, 6, 7, 8, 9]) == 4
    assert _accepted_along(path, [1]) == 0
    tree = D([5, 6, 7, 9, 10], [-1, 0, 1, 0, 3])  # 5 -> 6 -> 7 and 5 -> 9 -> 10
    assert _accepted_along(tree, [5, 9, 10, 11]) == 3
    assert _accepted_along(tree, [5, 6, 10]) == 2
    assert _accepted_along(D([], []), [1, 2]) == 0


def test_generated_pieces_form_one_response(tmp_path: Path) -> None:
    with Engine(tmp_path, vocab_size=1000, sync=False) as e:
        e.open_session("ns", "s")
        e.append("ns", "s", "prompt", [1, 2, 3])
        e.append("ns", "s", "generated", [10, 11])
        e.append("ns", "s", "generated", [12])
        r = e.append("ns", "s", "response", [13, 14])
        assert r.seq_id is not None
        rec = e.store.get_sequence(r.seq_id)
        assert rec is not None and rec["tokens"] == [10, 11, 12, 13, 14]
        c = e.stats("ns")["ns"]["counters"]
        assert c["requests"] == 1 and c["generated_tokens"] == 5


def test_concurrent_close_and_use_give_not_found_only(tmp_path: Path) -> None:
    import threading

    from suffixd.daemon.common.errors import NotFound

    errors: list[str] = []
    with Engine(tmp_path, vocab_size=1000, sync=False) as e:
        def churn() -> None:
            for i in range(200):
                e.open_session("n", f"s{i}", tokens=[1, 2, 3])
                e.close_session("n", f"s{i}")

        def use() -> None:
            for i in range(2000):
                try:
                    e.propose("n", f"s{i % 200}", [1, 2])
                    e.append("n", f"s{i % 200}", "generated", [4])
                except NotFound:
                    pass
                except Exception as exc:  # anything else is a bug
                    errors.append(repr(exc))

        threads = [threading.Thread(target=churn), threading.Thread(target=use)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert e.list_sessions("n") == []
