"""Unit tests for corpus walking and splitting (no daemon, no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from suffixd.cli.corpus import units as corpus
from suffixd.cli.corpus.units import (
    SkipFile,
    Unit,
    batch_units,
    content_hash,
    load_file,
    matches,
    split_file,
    split_jsonl,
    split_paragraphs,
    split_sql,
    split_text,
    walk,
)

# The example corpus keeps one statement per line in this file (examples/make_examples.py).
EXAMPLE_SQL = Path(__file__).resolve().parents[1] / "examples" / "corpus" / "sql" / "queries.sql"


# --------------------------------------------------------------------------- SQL


def test_sql_basic_statements_keep_their_semicolon() -> None:
    out = split_sql("SELECT 1;\nSELECT 2 ;  \n\n SELECT 3")
    assert out == ["SELECT 1;", "SELECT 2 ;", "SELECT 3"]


def test_sql_semicolons_inside_strings_and_comments_do_not_split() -> None:
    sql = (
        "INSERT INTO t VALUES ('a;b', \"c;d\", 'it''s; fine', 'back\\'slash;');\n"
        "-- a comment; with a semicolon\n"
        "SELECT /* block; comment */ x FROM `we;ird` JOIN [br;acket] ON 1;\n"
        "CREATE FUNCTION f() RETURNS int AS $body$ BEGIN RETURN 1; END; $body$ LANGUAGE plpgsql;\n"
        "SELECT $1, 'x' FROM y;"
    )
    out = split_sql(sql)
    assert len(out) == 4, out
    assert out[0].startswith("INSERT") and out[0].endswith("');")
    assert out[1].startswith("-- a comment; with a semicolon\nSELECT")
    assert "$body$ BEGIN RETURN 1; END; $body$" in out[2]
    assert out[3] == "SELECT $1, 'x' FROM y;"


def test_sql_empty_statements_and_trailing_comments_dropped() -> None:
    assert split_sql(";;  ;\n") == []
    assert split_sql("SELECT 1; -- done\n") == ["SELECT 1;"]
    assert split_sql("SELECT 1; /* end */") == ["SELECT 1;"]


def test_sql_unterminated_string_keeps_rest_as_one_statement() -> None:
    assert split_sql("SELECT 'oops; FROM t; SELECT 2;") == ["SELECT 'oops; FROM t; SELECT 2;"]


def test_sql_one_statement_per_line_file_of_example_corpus() -> None:
    text = EXAMPLE_SQL.read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    assert split_sql(text) == lines


_plain = st.text(
    alphabet=st.characters(blacklist_characters="';\"`[]$-/#*\\", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=20,
).filter(lambda s: s.strip() != "")
_literal = st.text(
    alphabet=st.characters(blacklist_characters="'\\", blacklist_categories=("Cs",)), max_size=10
).map(lambda s: "'" + s + "'")
_comment = st.text(
    alphabet=st.characters(blacklist_characters="\n\r*", blacklist_categories=("Cs",)), max_size=10
).map(lambda s: "/*" + s + "*/")
_statement = st.lists(st.one_of(_plain, _literal, _comment), min_size=1, max_size=6).map(
    lambda parts: "SELECT " + " ".join(parts)
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_statement, min_size=1, max_size=8), st.sampled_from(["\n", " ", "\n\n", ""]))
def test_sql_split_roundtrips_generated_statements(stmts: list[str], sep: str) -> None:
    text = sep.join(s + ";" for s in stmts)
    assert split_sql(text) == [(s + ";").strip() for s in stmts]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_sql_split_never_crashes_and_keeps_statements_in_order(text: str) -> None:
    out = split_sql(text)
    assert all(s and s.strip() == s and s != ";" for s in out)
    pos = 0
    for s in out:  # each statement is a verbatim slice of the text, in order
        found = text.find(s, pos)
        assert found >= 0
        pos = found + len(s)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="-#/", blacklist_categories=("Cs",)),
               max_size=200))
def test_sql_split_loses_no_code_without_comments(text: str) -> None:
    def code(s: str) -> str:
        return "".join(c for c in s if not c.isspace() and c != ";")

    assert "".join(code(s) for s in split_sql(text)) == code(text)


# --------------------------------------------------------------------------- text / JSONL


def test_text_small_whole_big_per_paragraph() -> None:
    small = "# Title\n\nsome text\n\nmore\n"
    assert split_text(small) == ["# Title\n\nsome text\n\nmore"]
    big = "\n\n".join(f"paragraph {i} " + "x" * 50 for i in range(10))
    paras = split_text(big, whole_limit=100)
    assert len(paras) == 10 and paras[3].startswith("paragraph 3")
    assert split_text("  \n\n ") == []


def test_paragraphs_keep_fenced_code_whole() -> None:
    text = "intro\n\n```python\ndef f():\n\n    return 1\n```\n\nend"
    assert split_paragraphs(text) == ["intro", "```python\ndef f():\n\n    return 1\n```", "end"]


def test_jsonl_workload_yields_assistant_turns_with_headers() -> None:
    rec = {
        "session": "s",
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "answer one"},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "answer two"},
        ],
    }
    kind, units = split_jsonl(json.dumps(rec) + "\n" + json.dumps(rec) + "\n")
    assert kind == "workload"
    head = "<assistant>\n"
    assert units[:2] == [Unit((head, "answer one")), Unit((head, "answer two"))]
    assert len(units) == 4
    _, all_roles = split_jsonl(json.dumps(rec), roles=("user", "assistant"))
    assert [u.segments[1] for u in all_roles] == ["q", "answer one", "q2", "answer two"]


def test_plain_jsonl_per_line_and_invalid_lines_kept() -> None:
    kind, units = split_jsonl('{"a": 1}\n\nnot json\n[1, 2]\n')
    assert kind == "jsonl"
    assert [u.text for u in units] == ['{"a": 1}', "not json", "[1, 2]"]


def test_binary_and_non_utf8_skipped() -> None:
    with pytest.raises(SkipFile, match="binary"):
        split_file("x.txt", b"abc\x00def")
    with pytest.raises(SkipFile, match="UTF-8"):
        split_file("x.sql", b"SELECT '\xff\xfe';")


def test_load_file_unreadable_raises_skip(tmp_path: Path) -> None:
    with pytest.raises(SkipFile, match="unreadable"):
        load_file("gone.sql", tmp_path / "gone.sql")


def test_content_hash_changes_with_content_and_version(monkeypatch: pytest.MonkeyPatch) -> None:
    a = content_hash(b"x")
    assert a == content_hash(b"x") != content_hash(b"y")
    monkeypatch.setattr(corpus, "SPLITTER_VERSION", corpus.SPLITTER_VERSION + 1)
    assert content_hash(b"x") != a


# --------------------------------------------------------------------------- walking


def test_matches_name_and_path_globs() -> None:
    assert matches("a/b/c.sql", ["*.sql"])
    assert not matches("a/b/c.md", ["*.sql"])
    assert matches("a/b/c.md", [])
    assert matches("a/b/c.md", ["a/*/*.md"])
    assert not matches("a/b/c.sql", ["*.sql"], ["c.*"])


def test_walk_recursive_sorted_skips_hidden(tmp_path: Path) -> None:
    for rel in ["b.sql", "a/x.sql", "a/y.md", ".git/config", "a/.swp.sql", "z/deep/q.sql"]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("SELECT 1;")
    assert [r for r, _ in walk(tmp_path, ["*.sql"])] == ["a/x.sql", "b.sql", "z/deep/q.sql"]
    assert len(list(walk(tmp_path))) == 4


# --------------------------------------------------------------------------- batching


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(1, 50), max_size=12), min_size=1, max_size=8),
       st.integers(1, 120))
def test_batches_cover_every_unit_once_in_order(sizes: list[list[int]], max_chars: int) -> None:
    files = [
        corpus.CorpusFile(f"f{i}", Path(f"f{i}"), "h", 0, "text",
                          [Unit(("x" * n,)) for n in units])
        for i, units in enumerate(sizes)
    ]
    seen: dict[str, list[int]] = {f.path: [] for f in files}
    for batch in batch_units(files, max_chars):
        assert batch
        for f, a, b in batch:
            assert 0 <= a <= b <= len(f.units)
            seen[f.path].extend(range(a, b))
    for f in files:
        assert seen[f.path] == list(range(len(f.units)))


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="ab\n", max_size=400), st.integers(1, 50))
def test_cap_units_preserves_text_and_bounds_size(text: str, cap: int) -> None:
    pieces = corpus.cap_units([Unit((text,))], cap)
    assert "".join(p.text for p in pieces) == text
    assert all(p.chars <= cap for p in pieces)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(1, 50), max_size=12), st.integers(0, 12)),
                min_size=1, max_size=8),
       st.integers(1, 120))
def test_resumed_files_send_the_rest_once_and_always_end(
    files_spec: list[tuple[list[int], int]], max_chars: int
) -> None:
    """A file resumed after ``resume_from`` units gets exactly the units from there on, in
    order, and one slice ending at its last unit (possibly empty: it marks the file done)."""
    files = []
    for i, (units, resume) in enumerate(files_spec):
        f = corpus.CorpusFile(f"f{i}", Path(f"f{i}"), "h", 0, "text",
                              [Unit(("x" * n,)) for n in units])
        f.resume_from = min(resume, len(units))
        files.append(f)
    seen: dict[str, list[int]] = {f.path: [] for f in files}
    ends: dict[str, int] = {f.path: 0 for f in files}
    for batch in batch_units(files, max_chars):
        for f, a, b in batch:
            assert f.resume_from <= a <= b <= len(f.units)
            seen[f.path].extend(range(a, b))
            ends[f.path] += b == len(f.units)
    for f in files:
        assert seen[f.path] == list(range(f.resume_from, len(f.units)))
        assert ends[f.path] == 1, (f.resume_from, len(f.units))
