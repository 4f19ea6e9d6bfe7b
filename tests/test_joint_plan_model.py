"""bench/joint_plan_model.py's accounting: on a hand-made step with a linear cost and no
padding the joint plan is never worse in expected cost per expected token than the
drafters' own cuts, and in the lockstep replay the trace alone decides what is accepted."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from suffixd.daemon.generation.step_planner import StepRows, joint_lengths

from suffixcache.drafter import Draft
from suffixcache.replay import Message, Session


def _load() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "bench" / "joint_plan_model.py"
    spec = importlib.util.spec_from_file_location("joint_plan_model", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


jpm = _load()


def linear(n: int) -> float:
    return 0.0 if n <= 0 else 1.0 + 0.28 * (n - 1)


def _cumulative(conditional: Sequence[float]) -> list[float]:
    out, p = [], 1.0
    for c in conditional:
        p *= c
        out.append(p)
    return out


draft_st = st.lists(st.floats(0.05, 1.0), min_size=0, max_size=8).map(_cumulative)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(draft_st, st.integers(0, 8)), min_size=2, max_size=5))
def test_joint_never_worse_than_own_cuts_linear_no_padding(
    seqs: list[tuple[list[float], int]],
) -> None:
    # sequence ids 0, 2, 4, ...: no two consecutive, so no padding
    reqs = [StepRows(2 * i, [1] * (len(p) + 1), 0, room=64, probs=p)
            for i, (p, _) in enumerate(seqs)]
    for r in reqs:
        r.kept = len(r.tokens)
    own = [1 + min(cut, len(p)) for p, cut in seqs]  # any cut a drafter made alone
    e_own, c_own = jpm.expected_step(reqs, own, linear)
    rate = e_own / c_own  # Dinkelbach at the per-sequence plan's own ratio
    joint = joint_lengths(reqs, linear, rate)
    e_j, c_j = jpm.expected_step(reqs, joint, linear)
    assert e_j - rate * c_j >= -1e-9
    assert e_j / c_j >= e_own / c_own - 1e-9


def test_expected_step_counts_padding() -> None:
    reqs = [StepRows(0, [1, 2, 3], 0, room=64, probs=[0.5, 0.25]),
            StepRows(1, [1], 0, room=64, probs=[])]
    e, c = jpm.expected_step(reqs, [3, 1], linear)
    assert e == pytest.approx(2.75)
    # 4 verified rows and 2 padding rows (the second sequence padded to 3)
    assert c == pytest.approx(linear(4) + 0.4 * (linear(6) - linear(4)))


# --- the lockstep replay with fake draft sources ---------------------------------------

H_USER, H_ASSISTANT = [900], [901]


def _sessions() -> list[Session]:
    out = []
    for s in range(3):
        msgs = []
        for t in range(2):
            msgs.append(Message("user", H_USER, [100 + s, 10 + t]))
            msgs.append(Message("assistant", H_ASSISTANT,
                                [(s * 31 + t * 7 + i) % 50 + 1 for i in range(9 + 3 * s)]))
        out.append(Session(f"s{s}", msgs))
    return out


class _Fake:
    """Drafts from the recorded sessions: ``truth`` proposes the next recorded tokens,
    else tokens that never occur; ``prob`` is its (deliberately wrong) estimate."""

    name = "fake"

    def __init__(self, sessions: list[Session], truth: bool, prob: float) -> None:
        self.truth, self.prob = truth, prob
        self.streams: dict[str, list[int]] = {}
        self.ends: dict[str, list[int]] = {}
        for s in sessions:
            stream: list[int] = []
            ends = []
            for m in s.messages:
                stream += m.header + m.content
                if m.role == "assistant":
                    ends.append(len(stream))
            self.streams[s.name], self.ends[s.name] = stream, ends
        self.observed: list[tuple[int, list[int], list[int]]] = []  # accepted, tokens, truth

    def _truth(self, key: str, n: int) -> list[int]:
        name = key.split(":", 1)[1]
        end = min(e for e in self.ends[name] if e > n)
        return self.streams[name][n:end]

    def begin_session(self, key: str) -> None: ...
    def append(self, key: str, tokens: Sequence[int], *, generated: bool) -> None: ...
    def end_turn(self, key: str, response: Sequence[int]) -> None: ...
    def end_session(self, key: str) -> None: ...
    def memory(self) -> dict[str, int]:
        return {}

    def propose(self, key: str, context: list[int], max_tokens: int) -> Draft:
        truth = self._truth(key, len(context))
        # a wrong draft's length differs from session to session (s0: 2, s1: 3, ...)
        toks = truth[:4] if self.truth else [999] * (2 + int(key.rsplit("s", 1)[1]))
        probs = [self.prob] * len(toks)
        d = Draft(toks, list(range(-1, len(toks) - 1)), probs, ["session"] * len(toks),
                  1, sum(probs), key=("ns", key))
        return d

    def observe(self, draft: Draft, accepted: int, accepted_tokens: Sequence[int]) -> None:
        self.observed.append((accepted, list(draft.tokens), list(accepted_tokens)))


@pytest.mark.parametrize("policy", ["per-seq", "joint"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_wrong_drafts_accept_nothing_whatever_their_estimates(policy: str, n: int) -> None:
    sessions = _sessions()
    fake = _Fake(sessions, truth=False, prob=0.99)
    tot = jpm.simulate(sessions, n, fake, linear, policy)
    out = sum(len(m.content) for s in sessions for m in s.messages if m.role == "assistant")
    assert tot.tokens == out and tot.accepted == 0
    assert tot.sequences == out  # one token per sequence and step
    assert all(a == 0 and len(t) == 1 for a, _, t in fake.observed)
    assert tot.turns == 6
    assert tot.drafted > 0  # high estimates: the drafts were verified, and all rejected


@pytest.mark.parametrize("n", [1, 2, 3])
def test_right_drafts_are_accepted_whatever_their_estimates(n: int) -> None:
    sessions = _sessions()
    fake = _Fake(sessions, truth=True, prob=0.01)
    # per-seq keeps every draft as its drafter made it: low estimates do not matter
    tot = jpm.simulate(sessions, n, fake, linear, "per-seq", record=True)
    out = sum(len(m.content) for s in sessions for m in s.messages if m.role == "assistant")
    assert tot.tokens == out
    assert tot.accepted == tot.drafted > 0
    for accepted, toks, new in fake.observed:
        assert accepted == len(toks)
        assert new[:accepted] == toks  # the accepted tokens are the recorded ones
    assert [a for a, _ in tot.observed] == [a for a, _, _ in fake.observed]


def test_plain_is_one_row_per_sequence() -> None:
    sessions = _sessions()
    out = sum(len(m.content) for s in sessions for m in s.messages if m.role == "assistant")
    tot = jpm.simulate(sessions, 3, None, linear, "plain")
    assert tot.tokens == tot.rows == tot.sequences == out
    assert tot.padding == 0 and tot.accepted == 0


@pytest.mark.parametrize("policy", ["per-seq", "joint"])
def test_no_padding_pads_nothing(policy: str) -> None:
    sessions = _sessions()
    padded = jpm.simulate(sessions, 3, _Fake(sessions, truth=False, prob=0.99), linear,
                          policy)
    tot = jpm.simulate(sessions, 3, _Fake(sessions, truth=False, prob=0.99), linear, policy,
                       padding=False)
    assert tot.padding == 0 and tot.rows == tot.sequences + tot.drafted
    assert padded.padding > 0  # the drafts' lengths differ from session to session
