"""Debouncing and the watchdog watcher (real inotify on a temp folder; no daemon)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from suffixd.cli.corpus.watch import CorpusWatcher, Debouncer


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_quiet_period_then_due() -> None:
    clock = FakeClock()
    d = Debouncer(quiet_s=0.5, max_delay_s=5.0, clock=clock)
    assert d.poll() is None and d.deadline() is None
    d.add("a", "upsert")
    clock.t += 0.4
    assert d.poll() is None
    d.add("b", "upsert")  # restarts the quiet period
    clock.t += 0.4
    assert d.poll() is None
    clock.t += 0.11
    assert d.poll() == {"a": "upsert", "b": "upsert"}
    assert d.poll() is None and d.pending() == 0


def test_max_delay_bounds_a_never_ending_burst() -> None:
    clock = FakeClock()
    d = Debouncer(quiet_s=0.5, max_delay_s=2.0, clock=clock)
    out = None
    for i in range(100):
        d.add(f"f{i % 3}", "upsert")
        clock.t += 0.1
        out = d.poll()
        if out is not None:
            break
    assert out is not None and set(out) == {"f0", "f1", "f2"}
    assert 1000.0 + 2.0 <= clock.t <= 1000.0 + 2.0 + 0.1 + 1e-9


def test_last_op_wins_per_path() -> None:
    clock = FakeClock()
    d = Debouncer(quiet_s=0.1, max_delay_s=1.0, clock=clock)
    d.add("x", "upsert")
    d.add("x", "delete")
    d.add("y", "delete")
    d.add("y", "upsert")
    clock.t += 1
    assert d.take() == {"x": "delete", "y": "upsert"}


def test_bad_parameters_rejected() -> None:
    with pytest.raises(ValueError):
        Debouncer(quiet_s=2, max_delay_s=1)


_events = st.lists(
    st.tuples(st.floats(0, 1.0), st.sampled_from("abcde"), st.sampled_from(["upsert", "delete"])),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(_events, st.floats(0.01, 0.5), st.floats(0, 2.0))
def test_debouncer_model(events: list[tuple[float, str, str]], quiet: float, extra: float) -> None:
    """Against a reference model: every event is delivered exactly once, in a batch holding the
    last op of its path in that batch, no batch is delivered before its deadline, and none is
    held past it when polled."""
    clock = FakeClock()
    d = Debouncer(quiet_s=quiet, max_delay_s=quiet + extra, clock=clock)
    batches: list[dict[str, str]] = []
    first = last = None
    expected: dict[str, str] = {}
    for dt, path, op in events:
        clock.t += dt
        if first is not None and last is not None:
            due = min(last + quiet, first + quiet + extra)
            got = d.poll()
            if clock.t >= due:
                assert got == expected
                batches.append(got)
                first = last = None
                expected = {}
            else:
                assert got is None
        d.add(path, op)  # type: ignore[arg-type]
        if first is None:
            first = clock.t
        last = clock.t
        expected[path] = op
    clock.t += quiet + extra + 1
    final = d.poll()
    assert final == (expected or None)


def test_wait_blocks_until_quiet_and_close_releases() -> None:
    d = Debouncer(quiet_s=0.2, max_delay_s=1.0)
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(d.wait(timeout=5)))
    t.start()
    t0 = time.monotonic()
    d.add("p", "upsert")
    t.join(5)
    assert got == [{"p": "upsert"}]
    assert time.monotonic() - t0 >= 0.19
    assert d.wait(timeout=0.05) is None
    d.close()
    assert d.wait() is None


def _collect(w: CorpusWatcher, seconds: float = 3.0) -> dict[str, str]:
    out: dict[str, str] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        batch = w.debouncer.wait(timeout=0.2)
        if batch:
            out.update(batch)
            if w.debouncer.pending() == 0:
                # give a straggler event of the same burst a moment
                more = w.debouncer.wait(timeout=0.3)
                if more:
                    out.update(more)
                return out
    return out


def test_watcher_reports_selected_changes(tmp_path: Path) -> None:
    (tmp_path / "keep.sql").write_text("SELECT 1;")
    (tmp_path / "sub").mkdir()
    w = CorpusWatcher(tmp_path, includes=["*.sql"], debouncer=Debouncer(0.15, 1.0))
    with w:
        time.sleep(0.1)
        for i in range(5):  # a burst of writes to one file is one upsert
            (tmp_path / "sub" / "new.sql").write_text(f"SELECT {i};")
        (tmp_path / "ignored.md").write_text("no")
        (tmp_path / ".hidden.sql").write_text("SELECT 0;")
        batch = _collect(w)
        assert batch == {str(tmp_path / "sub" / "new.sql"): "upsert"}

        (tmp_path / "keep.sql").unlink()
        (tmp_path / "sub" / "new.sql").rename(tmp_path / "moved.sql")
        batch = _collect(w)
        assert batch == {
            str(tmp_path / "keep.sql"): "delete",
            str(tmp_path / "sub" / "new.sql"): "delete",
            str(tmp_path / "moved.sql"): "upsert",
        }
