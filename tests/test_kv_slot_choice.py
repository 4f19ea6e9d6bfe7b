"""Which sequence id a new session's KV slot takes (kv_slots.pick_free_id, pick_victim):
against the rule written plainly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from suffixd.daemon.generation.kv_slots import pick_free_id, pick_victim

ids = st.integers(0, 15)


def neighbours(s: int, busy: set[int]) -> int:
    return sum(1 for b in busy if abs(b - s) == 1)


@given(st.sets(ids, min_size=1), st.sets(ids))
def test_a_free_id_next_to_the_most_busy_ones_then_the_lowest(free, busy) -> None:
    busy -= free
    got = pick_free_id(sorted(free, reverse=True), busy)
    best = max(neighbours(s, busy) for s in free)
    assert got == min(s for s in free if neighbours(s, busy) == best)


@given(st.dictionaries(ids, st.floats(0, 100), min_size=1), st.sets(ids))
def test_the_victim_is_next_to_the_most_busy_ones_then_least_recently_used(idle, busy) -> None:
    busy -= set(idle)
    got = pick_victim([(t, s, f"k{s}") for s, t in idle.items()], busy)
    best = max(neighbours(s, busy) for s in idle)
    near = {s: t for s, t in idle.items() if neighbours(s, busy) == best}
    oldest = min(near.values())
    assert got == f"k{min(s for s, t in near.items() if t == oldest)}"


def test_two_agents_in_four_slots_stay_side_by_side() -> None:
    # agent A in id 2; id 3 idle since 9.0, id 0 since 1.0 (the least recently used)
    assert pick_victim([(1.0, 0, "old0"), (5.0, 1, "one"), (9.0, 3, "three")], {2}) == "one"
    assert pick_victim([(1.0, 0, "old0"), (9.0, 3, "three")], {2}) == "three"
    # nothing busy: the least recently used, as before
    assert pick_victim([(5.0, 0, "a"), (1.0, 3, "b")], set()) == "b"
    assert pick_free_id([3, 0, 2], {1}) == 0 and pick_free_id([3, 2], {1}) == 2
    assert pick_free_id([0, 2], {1, 3}) == 2  # between two busy ones
