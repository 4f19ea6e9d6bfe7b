"""suffixcache.store: the LMDB store (durable group commit, map growth, model-based checks)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from suffixcache.store import Store, TokenizerMismatchError
from suffixcache.store_layout import pack_tokens, unpack_tokens

tokens_st = st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), max_size=50)


@given(tokens_st)
def test_pack_roundtrip(tokens: list[int]) -> None:
    data = pack_tokens(tokens)
    assert len(data) == 4 * len(tokens)
    assert unpack_tokens(data) == tokens


def test_pack_is_little_endian_int32() -> None:
    assert pack_tokens([1, 256, -1]) == b"\x01\x00\x00\x00\x00\x01\x00\x00\xff\xff\xff\xff"


ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from(["a", "b"]),
                  st.sampled_from(["response", "corpus"]),
                  st.lists(st.integers(0, 1000), max_size=20)),
        st.tuples(st.just("del"), st.integers(0, 30)),
        st.tuples(st.just("chunk"), st.sampled_from(["a", "b"]), st.sampled_from(["s1", "s2"]),
                  st.lists(st.integers(0, 1000), min_size=1, max_size=20)),
        st.tuples(st.just("close"), st.sampled_from(["a", "b"]), st.sampled_from(["s1", "s2"])),
    ),
    max_size=40,
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops_st)
def test_store_matches_model_after_reopen(tmp_path_factory: pytest.TempPathFactory,
                                          ops: list[tuple]) -> None:
    path = tmp_path_factory.mktemp("store")
    seqs: dict[int, tuple[str, str, list[int]]] = {}
    sessions: dict[tuple[str, str], list[int]] = {}
    recs: dict[tuple[str, str], dict] = {}
    with Store(path, map_size=1 << 15) as store:
        for op in ops:
            if op[0] == "add":
                _, ns, kind, toks = op
                sid = store.write(lambda t, ns=ns, kind=kind, toks=toks:
                                  t.add_sequence(ns, kind, toks))
                assert sid not in seqs
                seqs[sid] = (ns, kind, toks)
            elif op[0] == "del":
                found = store.write(lambda t, i=op[1]: t.delete_sequence(i))
                assert found == (op[1] in seqs)
                seqs.pop(op[1], None)
            elif op[0] == "chunk":
                _, ns, s, toks = op
                rec = recs.setdefault((ns, s), {"ns": ns, "id": s, "chunks": 0, "tokens": 0})

                def append(t, rec=rec, toks=toks):  # type: ignore[no-untyped-def]
                    r = dict(rec)
                    t.append_chunk(r, "prompt", toks)
                    return r

                recs[(ns, s)] = store.write(append)
                sessions.setdefault((ns, s), []).extend(toks)
            else:
                _, ns, s = op
                store.write(lambda t, ns=ns, s=s: t.delete_session(ns, s))
                sessions.pop((ns, s), None)
                recs.pop((ns, s), None)
    with Store(path) as store:
        got = {r["id"]: (r["ns"], r["kind"], r["tokens"]) for r in store.iter_sequences(batch=3)}
        assert got == seqs
        assert list(got) == sorted(got)  # insertion order
        got_sessions = {(r["ns"], r["id"]): store.session_tokens(r["ns"], r["id"])
                        for r in store.iter_sessions()}
        assert got_sessions == sessions
        for (ns, s), toks in sessions.items():
            assert store.get_session(ns, s)["tokens"] == len(toks)


def test_map_grows_instead_of_failing(tmp_path: Path) -> None:
    with Store(tmp_path, map_size=1 << 14) as store:
        big = list(range(200_000))
        for _ in range(5):
            store.write(lambda t: t.add_sequence("ns", "response", big))
        assert store.resizes >= 1
        assert store.stat()["map_size"] > 1 << 20
    with Store(tmp_path) as store:
        assert [len(r["tokens"]) for r in store.iter_sequences()] == [200_000] * 5


def test_concurrent_writers_share_commits(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        n_threads, per_thread = 8, 50
        barrier = threading.Barrier(n_threads)

        def work(i: int) -> None:
            barrier.wait()
            for j in range(per_thread):
                store.write(lambda t, i=i, j=j: t.add_sequence("ns", "response", [i, j]))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ids = [r["id"] for r in store.iter_sequences()]
        assert len(ids) == len(set(ids)) == n_threads * per_thread
        # Group commit: fewer transactions than writes (8 writers queue while one commits).
        assert store.commits < n_threads * per_thread


def test_failing_job_does_not_sink_its_group(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        def bad(t):  # type: ignore[no-untyped-def]
            t.add_sequence("ns", "response", [1])
            raise RuntimeError("boom")

        futs = [store.submit(lambda t: t.add_sequence("ns", "response", [2])), store.submit(bad),
                store.submit(lambda t: t.add_sequence("ns", "response", [3]))]
        assert futs[0].result() and futs[2].result()
        with pytest.raises(RuntimeError, match="boom"):
            futs[1].result()
        assert sorted(r["tokens"][0] for r in store.iter_sequences()) == [2, 3]


def test_tokenizer_fingerprint_recorded_and_checked(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        store.check_tokenizer("aaaa", 100)
        store.check_tokenizer("aaaa", 100)
        store.check_tokenizer(None, None)  # a token-ids-only user may open it
    with Store(tmp_path) as store:
        with pytest.raises(TokenizerMismatchError, match="tokenizer aaaa"):
            store.check_tokenizer("bbbb", 100)
        with pytest.raises(TokenizerMismatchError, match="vocabulary of 100"):
            store.check_tokenizer(None, 101)


def test_documents_and_counters(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        store.write(lambda t: t.put_doc("ns", "a.sql", {"seqs": [1, 2], "hash": "h"}))
        store.write(lambda t: t.put_doc("ns2", "b.sql", {"seqs": [], "hash": "g"}))
        store.write(lambda t: t.put_counters("ns", "", {"steps": 3}))
        store.write(lambda t: t.put_counters("ns", "s1", {"steps": 1}))
    with Store(tmp_path) as store:
        assert store.get_doc("ns", "a.sql") == {"seqs": [1, 2], "hash": "h"}
        assert [k for _, k, _ in store.iter_docs("ns")] == ["a.sql"]
        assert len(store.iter_docs()) == 2
        assert sorted(store.iter_counters()) == [("ns", "", {"steps": 3}),
                                                 ("ns", "s1", {"steps": 1})]


def test_session_response_index(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        rec = {"ns": "ns", "id": "s", "chunks": 0, "tokens": 0}

        def add(t):  # type: ignore[no-untyped-def]
            seqs = [t.add_sequence("ns", "response", [i], session="s") for i in range(3)]
            for q in seqs:
                t.add_session_response("ns", "s", q)
            t.append_chunk(dict(rec), "prompt", [1])
            return seqs

        seqs = store.write(add)
        store.write(lambda t: t.add_session_response("ns", "s2", 99))  # another session
        assert store.write(lambda t: t.session_responses("ns", "s")) == seqs
        store.write(lambda t: t.delete_session("ns", "s"))
        assert store.write(lambda t: t.session_responses("ns", "s")) == []
        assert store.write(lambda t: t.session_responses("ns", "s2")) == [99]
        assert store.session_chunks("ns", "s") == []


def test_lazy_writes_wait_for_company(tmp_path: Path) -> None:
    """A lazy write commits with the next write that is not lazy (or a kick, or close),
    not on its own, within the lazy interval."""
    with Store(tmp_path / "s", sync=False, lazy_interval_s=60.0) as store:
        store.write(lambda t: t.put_meta("a", 1))  # a commit just ended
        commits = store.commits
        lazy = [store.submit(lambda t, i=i: t.put_meta(f"lazy{i}", i), lazy=True)
                for i in range(3)]
        for f in lazy:
            assert not f.done()
        store.write(lambda t: t.put_meta("b", 2))  # not lazy: takes the lazy ones along
        assert all(f.done() for f in lazy)
        assert store.commits == commits + 1
        assert [store.get_meta(f"lazy{i}") for i in range(3)] == [0, 1, 2]
        late = store.submit(lambda t: t.put_meta("late", 3), lazy=True)
        store.kick()
        late.result(timeout=30)
        last = store.submit(lambda t: t.put_meta("last", 4), lazy=True)
    assert last.done()  # close commits what is queued
    with Store(tmp_path / "s", sync=False) as store:
        assert store.get_meta("late") == 3 and store.get_meta("last") == 4
