"""`suffixd warm` through a real daemon (subprocess, Unix socket, LMDB, gemma tokenizer)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from suffixd.cli.corpus.units import content_hash
from suffixd.cli.warm import warm
from suffixd.v1 import corpus_pb2, corpus_pb2_grpc

SQL_A = "SELECT zorblax_quux_total , wibble_name FROM frobnicator_table WHERE wibble_id = 4242 ;"
SQL_B = (
    "SELECT count ( * ) FROM gloopdorf_orders AS T1 JOIN snarfle_items AS T2 ON T1.zid = T2.zid ;"
)
MD_TEXT = (
    "# Runbook\n\nRestart the plonkwhistle service with `systemctl restart plonkwhistle-agent`."
)
TURN = (
    "THOUGHT: I will grep for the quibblefrost helper.\n\n"
    "```bash\ngrep -rn quibblefrost_helper django/\n```"
)


def run_warm(daemon: Any, *args: str) -> dict[str, Any]:
    res = CliRunner().invoke(
        warm, [*args, "--socket", daemon.proc.socket.removeprefix("unix:"), "--json"],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.output.strip().splitlines()[-1])


def corpus_stub(daemon: Any) -> Any:
    return daemon.stub_for(corpus_pb2_grpc.CorpusStub)


def list_files(daemon: Any, ns: str) -> dict[str, Any]:
    resp = daemon.call(corpus_stub(daemon).ListFiles, corpus_pb2.ListFilesRequest(namespace=ns))
    return {f.path: f for f in resp.files}


def continuation(daemon: Any, ns: str, text: str, cut: float = 0.4) -> tuple[str, str, str]:
    """(source, drafted text, true remainder) for a context made of the first part of text."""
    ids = daemon.tokenize(text)
    k = max(3, int(len(ids) * cut))
    draft = daemon.speculate(ns, None, ids[:k], max_tokens=64)
    rest = daemon.detokenize(ids[k:])
    return draft.source, daemon.detokenize(draft.path()), rest


def drafts_text(daemon: Any, ns: str, text: str) -> bool:
    source, drafted, rest = continuation(daemon, ns, text)
    return source == "corpus" and len(drafted) >= 8 and rest.startswith(drafted[:8])


def make_corpus(root: Path) -> None:
    (root / "sql").mkdir(parents=True)
    (root / "sql" / "a.sql").write_text(f"{SQL_A}\n-- a comment; not a statement\n{SQL_B}\n")
    (root / "docs").mkdir()
    (root / "docs" / "runbook.md").write_text(MD_TEXT)
    rec = {"session": "s1", "messages": [{"role": "user", "content": "fix it"},
                                         {"role": "assistant", "content": TURN}]}
    (root / "trace.jsonl").write_text(json.dumps(rec) + "\n")
    (root / "blob.bin").write_bytes(b"\x00\x01\x02binary\xff")
    (root / ".hidden.sql").write_text("SELECT 1;")


def test_warm_real_folder_idempotent_changes_and_deletes(daemon: Any, tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    make_corpus(root)
    ns = "warmtest"
    s = run_warm(daemon, "--corpus", str(root), "-n", ns)
    assert s["scanned"] == 4 and s["warmed"] == 3 and s["skipped"] == 1, s
    # 2 statements + 1 markdown doc + 1 assistant turn
    assert s["units"] == 4 and s["tokens"] > 40

    files = list_files(daemon, ns)
    key = (root / "sql" / "a.sql").as_posix()
    assert set(files) == {key, (root / "docs/runbook.md").as_posix(),
                          (root / "trace.jsonl").as_posix()}
    assert files[key].complete and files[key].sequences == 2
    assert files[key].content_hash == content_hash((root / "sql" / "a.sql").read_bytes())

    for text in (SQL_A, SQL_B, MD_TEXT, TURN):
        assert drafts_text(daemon, ns, text), text
    # Namespaces isolate: the same context drafts nothing from the corpus elsewhere.
    assert continuation(daemon, "other-ns", SQL_A)[0] != "corpus"

    stats = daemon.stats(ns)
    corpus_size = stats["namespaces"][0]["corpus"]
    assert int(corpus_size["sequences"]) == 4

    # Unchanged files are not sent again.
    s = run_warm(daemon, "--corpus", str(root), "-n", ns)
    assert s["warmed"] == 0 and s["unchanged"] == 3 and s["tokens"] == 0, s

    # A changed file replaces its sequences; a deleted file's sequences go away.
    new_sql = "SELECT blimpquork FROM zanzibar_lighthouse WHERE keeper_name = 'O''Brien; jr' ;"
    (root / "sql" / "a.sql").write_text(new_sql + "\n")
    (root / "docs" / "runbook.md").unlink()
    s = run_warm(daemon, "--corpus", str(root), "-n", ns)
    assert s["warmed"] == 1 and s["removed"] == 1 and s["replaced_sequences"] == 2, s
    assert drafts_text(daemon, ns, new_sql)
    for gone in (SQL_A, SQL_B, MD_TEXT):
        assert not drafts_text(daemon, ns, gone), gone
    assert drafts_text(daemon, ns, TURN)
    stats = daemon.stats(ns)
    assert int(stats["namespaces"][0]["corpus"]["sequences"]) == 2


def test_interrupted_warm_leaves_consistent_store_and_resumes(daemon: Any, tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    path = root / "big.sql"
    stmts = [f"SELECT col_{i} , zibzab_{i} FROM resumable_table_{i} ;" for i in range(50)]
    path.write_text("\n".join(stmts) + "\n")
    key = path.as_posix()
    h = content_hash(path.read_bytes())
    ns = "resume"
    # A warm that died after its first batch: first chunk without the last one.
    first = corpus_pb2.FileChunk(path=key, content_hash=h, first=True, last=False,
                                 units=[corpus_pb2.CorpusUnit(segments=[s]) for s in stmts[:20]])
    replies = list(corpus_stub(daemon).WarmFiles(iter([
        corpus_pb2.WarmRequest(namespace=ns, chunks=[first])])))
    assert replies[0].units == 20 and not replies[0].completed
    f = list_files(daemon, ns)[key]
    assert not f.complete and f.sequences == 20

    assert f.units == 20

    # A resume chunk that does not start where the stored version ends is refused.
    import grpc

    skip = corpus_pb2.FileChunk(path=key, content_hash=h, first=False, last=True, offset=25,
                                units=[corpus_pb2.CorpusUnit(segments=[s]) for s in stmts[25:]])
    with pytest.raises(grpc.RpcError) as ei:
        list(corpus_stub(daemon).WarmFiles(iter([
            corpus_pb2.WarmRequest(namespace=ns, chunks=[skip])])))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "holds 20 units" in (ei.value.details() or "")
    assert list_files(daemon, ns)[key].sequences == 20

    # The next warm resumes the file after the 20 units already stored: only the other 30
    # are sent, nothing is replaced, nothing is duplicated.
    s = run_warm(daemon, "--corpus", str(root), "-n", ns, "--batch-chars", "1000")
    assert s["warmed"] == 1 and s["resumed"] == 1, s
    assert s["units"] == 30 and s["replaced_sequences"] == 0, s
    f = list_files(daemon, ns)[key]
    assert f.complete and f.sequences == 50 and f.units == 50
    assert int(daemon.stats(ns)["namespaces"][0]["corpus"]["sequences"]) == 50
    # Both halves draft: the stored 20 and the resumed 30.
    assert drafts_text(daemon, ns, stmts[3]) and drafts_text(daemon, ns, stmts[40])

    # Interrupted again, then the file changed: the next warm starts it over.
    list(corpus_stub(daemon).WarmFiles(iter([
        corpus_pb2.WarmRequest(namespace=ns, chunks=[corpus_pb2.FileChunk(
            path=key, content_hash=h, first=True, last=False,
            units=[corpus_pb2.CorpusUnit(segments=[s]) for s in stmts[:20]])])])))
    path.write_text("\n".join(stmts[:45]) + "\n")
    s = run_warm(daemon, "--corpus", str(root), "-n", ns)
    assert s["resumed"] == 0 and s["units"] == 45 and s["replaced_sequences"] == 20, s
    assert list_files(daemon, ns)[key].sequences == 45
    assert int(daemon.stats(ns)["namespaces"][0]["corpus"]["sequences"]) == 45

    # A continuation chunk of a file that was never begun is refused, store untouched.
    bad = corpus_pb2.FileChunk(path=key + ".x", content_hash=h, first=False, last=True,
                               units=[corpus_pb2.CorpusUnit(segments=["SELECT 1 ;"])])
    with pytest.raises(grpc.RpcError) as ei:
        list(corpus_stub(daemon).WarmFiles(iter([
            corpus_pb2.WarmRequest(namespace=ns, chunks=[bad])])))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as ei:
        list(corpus_stub(daemon).WarmFiles(iter([corpus_pb2.WarmRequest(namespace="")])))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert int(daemon.stats(ns)["namespaces"][0]["corpus"]["sequences"]) == 45


def test_warm_reports_unreachable_daemon(tmp_path: Path) -> None:
    (tmp_path / "a.sql").write_text("SELECT 1;")
    res = CliRunner().invoke(warm, ["--corpus", str(tmp_path), "--socket",
                                    str(tmp_path / "nope.sock")])
    assert res.exit_code != 0
    assert "the daemon is not running at" in res.output


def _wait_for(pred: Any, timeout: float = 20.0, what: str = "") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_watch_follows_changes_and_deletes(daemon: Any, tmp_path: Path) -> None:
    root = tmp_path / "watched"
    root.mkdir()
    (root / "a.sql").write_text(SQL_A + "\n")
    (root / "b.sql").write_text(SQL_B + "\n")
    ns = "watch"
    cmd = [sys.executable, "-m", "suffixd.cli.main", "warm", "--corpus", str(root), "-n", ns,
           "--include", "*.sql", "--watch", "--debounce", "0.2", "--no-progress",
           "--socket", daemon.proc.socket.removeprefix("unix:")]
    log = open(tmp_path / "watch.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    try:
        key_a, key_b = (root / "a.sql").as_posix(), (root / "b.sql").as_posix()
        _wait_for(lambda: len(list_files(daemon, ns)) == 2, what="initial warm")
        assert drafts_text(daemon, ns, SQL_A) and drafts_text(daemon, ns, SQL_B)

        # Modify a file in a burst of writes: the new content replaces the old.
        new_a = "SELECT quantum_flubber , gizmo_rank FROM hyperloop_depots WHERE depot_zone = 77 ;"
        for i in range(3):
            (root / "a.sql").write_text(new_a + f"\n-- edit {i}\n")
        want = content_hash((root / "a.sql").read_bytes())
        _wait_for(lambda: list_files(daemon, ns)[key_a].content_hash == want, what="rewarm a")
        assert drafts_text(daemon, ns, new_a)
        assert not drafts_text(daemon, ns, SQL_A)

        # Delete a file: its sequences go at once.
        (root / "b.sql").unlink()
        _wait_for(lambda: key_b not in list_files(daemon, ns), what="removal of b")
        assert not drafts_text(daemon, ns, SQL_B)

        # A new file in a new folder is picked up; a non-matching file is ignored.
        (root / "sub").mkdir()
        (root / "sub" / "c.sql").write_text(SQL_B + "\n")
        (root / "notes.md").write_text("not included")
        key_c = (root / "sub" / "c.sql").as_posix()
        _wait_for(lambda: key_c in list_files(daemon, ns), what="new file c")
        assert drafts_text(daemon, ns, SQL_B)
        assert set(list_files(daemon, ns)) == {key_a, key_c}
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(20)
        log.close()
    assert code == 0, (tmp_path / "watch.log").read_text()


def many_statements(n: int) -> list[str]:
    """n distinct one-line SQL statements of ~130 tokens each, built from the example corpus."""
    base = (Path(__file__).resolve().parents[1] / "examples/corpus/sql/queries.sql")
    queries = [q.removesuffix(" ;") for q in base.read_text().splitlines() if q.strip()]
    k = len(queries)
    return [f"{queries[i % k]} AND {queries[(i * 7) % k].split()[1]} <> {i} "
            f"OR ({queries[(i * 3 + 1) % k]}) IS NULL OR ({queries[(i * 5 + 2) % k]}) = {i % 97} ;"
            for i in range(n)]


def test_killed_warm_process_resumes_consistently(daemon: Any, tmp_path: Path) -> None:
    root = tmp_path / "many"
    root.mkdir()
    # Enough work that the warm is still running when it is killed.
    stmts = many_statements(3500)
    n_files = 40
    per = len(stmts) // n_files
    for i in range(n_files):
        (root / f"f{i:03d}.sql").write_text("\n".join(stmts[i * per : (i + 1) * per]) + "\n")
    ns = "killed"
    cmd = [sys.executable, "-m", "suffixd.cli.main", "warm", "--corpus", str(root), "-n", ns,
           "--no-progress", "--batch-chars", "5000",  # many small transactions
           "--socket", daemon.proc.socket.removeprefix("unix:")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(lambda: len(list_files(daemon, ns)) >= 2, timeout=60, what="first files")
    proc.kill()
    proc.wait(10)

    def completed() -> int:
        return sum(f.complete for f in list_files(daemon, ns).values())

    # A chunk already received when the client died still commits (or is cancelled):
    # count what is complete once the daemon has settled.
    done_before = completed()
    while True:
        time.sleep(0.5)
        now = completed()
        if now == done_before:
            break
        done_before = now
    assert done_before < n_files, "the warm finished before it could be interrupted"

    s = run_warm(daemon, "--corpus", str(root), "-n", ns)
    assert s["unchanged"] == done_before and s["warmed"] == n_files - done_before, s
    files = list_files(daemon, ns)
    assert len(files) == n_files and all(f.complete for f in files.values())
    assert sum(f.sequences for f in files.values()) == per * n_files
    corpus = daemon.stats(ns)["namespaces"][0]["corpus"]
    assert int(corpus["sequences"]) == per * n_files


def test_accepted_corpus_tokens_are_credited_to_their_file(daemon: Any, tmp_path: Path) -> None:
    corpus = tmp_path / "credit"
    corpus.mkdir()
    (corpus / "a.sql").write_text(SQL_A + "\n")
    (corpus / "b.sql").write_text(SQL_B + "\n")
    run_warm(daemon, "--corpus", str(corpus), "--namespace", "credit")
    ids = daemon.tokenize(SQL_B)
    k = len(ids) // 3
    with daemon.session(namespace="credit") as s:
        s.append(tokens=ids[:k], kind="prompt")
        draft = s.speculate(max_tokens=32)
        assert draft.source == "corpus" and len(draft.tokens) > 0
        truth = ids[k : k + len(draft.tokens) + 1]
        s.append(tokens=truth, kind="generated")  # the daemon compares with its last draft
    top = daemon.stats(namespace="credit")["namespaces"][0]["top_documents"]
    assert top, "no corpus document was credited"
    assert top[0]["doc_key"].endswith("b.sql") and int(top[0]["accepted"]) > 0
