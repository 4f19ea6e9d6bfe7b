"""What one generation asks, reports and carries through the verifier's step loop: the
request's parameters (``GenerateParams``), its statistics and chunks, a generation's state
(``Run``), one step's draft and rows (``Step``) and the target's verdict on them
(``verdict``: greedy or speculative sampling, under a grammar or not).

``Verifier._generate`` (daemon/generation/verifier.py) runs the phases over these; nothing
here decodes: the logit rows come from the verifier (``LogitRows``).
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .certify import TokenGap, token_gap
from .grammar import Grammar, GrammarState, constrained_argmax
from .sampling import SamplingNoise, race, speculative_sample, target_probs
from .step_planner import StepRows

if TYPE_CHECKING:
    from .kv_slots import Slot


class Model(Protocol):
    """What a generation reads of its verifier (not imported: the verifier imports this
    module): the vocabulary's size, and the last batch's logit rows in place."""

    @property
    def vocab_size(self) -> int: ...

    def _logits_view(self, i: int) -> np.ndarray: ...


class DraftLike(Protocol):
    tokens: list[int]
    source: str

    def path(self) -> list[int]: ...


Proposer = Callable[[list[int], int], "DraftLike | Sequence[int] | None"]
# on_step(draft, accepted, new): ``new`` is the accepted draft tokens and the verifier's own
# next token after them.
StepCallback = Callable[[Any, int, list[int]], None]


@dataclass
class GenerateParams:
    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0  # 0: disabled
    top_p: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = ()
    max_draft: int = 32  # upper bound; the proposer decides how much of it pays off
    ignore_eos: bool = False
    record_gaps: bool = False  # per-token top-1/top-2 logit gaps, for lossless checks
    # A GBNF grammar the output must match (grammar.py): drafts are cut where it forbids
    # a token, and every position is chosen from the constrained target distribution.
    grammar: str | None = None

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.temperature < 0 or not np.isfinite(self.temperature):
            raise ValueError("temperature must be >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.max_draft < 0:
            raise ValueError("max_draft must be >= 0")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens reused from the session's KV cache
    completion_tokens: int = 0
    steps: int = 0  # verifier evaluations during decoding
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    prompt_s: float = 0.0  # prompt processing
    # arrival -> its first step's decode: waiting for a KV slot, for other steps, for
    # exclusive work (BatchCounters.queue_s sums it over requests)
    queue_s: float = 0.0
    first_token_s: float = 0.0  # request start -> first generated token
    decode_s: float = 0.0  # first -> last generated token
    total_s: float = 0.0
    # Time spent recording logit gaps (record_gaps: a benchmark's certification, which
    # the daemon never does); decode_s, first_token_s and total_s leave it out.
    record_s: float = 0.0
    by_source: dict[str, list[int]] = field(default_factory=dict)  # source -> [drafted, accepted]

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "steps": self.steps,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "prompt_s": self.prompt_s,
            "queue_s": self.queue_s,
            "first_token_s": self.first_token_s,
            "decode_s": self.decode_s,
            "total_s": self.total_s,
            "by_source": {k: list(v) for k, v in self.by_source.items()},
        }


@dataclass
class Chunk:
    text: str
    tokens: list[int]
    source: str  # where this step's draft came from ("none" for plain steps)
    proposed: int
    accepted: int
    finish_reason: str | None = None  # "stop" | "length" on the final chunk
    stats: GenerationStats | None = None  # final chunk only
    gaps: list[TokenGap] = field(default_factory=list)


def draft_path(draft: Any) -> tuple[list[int], str]:
    if draft is None:
        return [], "none"
    if hasattr(draft, "path"):
        return [int(t) for t in draft.path()], str(getattr(draft, "source", "none"))
    return [int(t) for t in draft], "draft"


def cut_draft(draft: Any, k: int) -> Any:
    """The draft as a step evaluated it: its first ``k`` tokens (what ``on_step`` reports)."""
    if hasattr(draft, "head"):
        return draft.head(k)
    if isinstance(draft, list):
        return draft[:k]
    return draft


def _greedy(rows: Sequence[np.ndarray], states: list[GrammarState], i: int) -> int:
    if not states:
        return int(np.argmax(rows[i]))
    return constrained_argmax(rows[i], states[i])



def gap_records(req: StepRows, rows: Sequence[np.ndarray], states: list[GrammarState],
                 chosen: Sequence[int]) -> list[TokenGap]:
    """What each row of the step said where ``chosen`` took its token (the grammar's mask
    applied), with the step's batch shape: greedy and sampled runs alike, so a test can
    tell that a row was its own sequence's."""
    own = req.tokens[: req.kept]
    shape = tuple(own + [own[-1]] * (req.rows - req.kept))
    gaps = []
    for i, tok in enumerate(chosen):
        g = token_gap(states[i].mask(rows[i]) if states else rows[i], tok)
        g.pos0, g.batch, g.row, g.outputs = req.pos0, shape, i, req.outputs
        gaps.append(g)
    return gaps

def _constrained_winner(
    states: list[GrammarState], dist: Callable[[np.ndarray], np.ndarray], raw_race_ok: bool,
) -> Callable[[int, np.ndarray, np.ndarray], int]:
    """Row i's race against the constrained target: the distribution over what the grammar
    allows after ``path[:i]`` (``states[i]``). With the same noise, a raw winner that the
    grammar allows wins the constrained race too (the allowed weights are the raw ones,
    rescaled), so the allowed set is searched only when it does not, and every row is
    masked only when top-k/top-p make the constrained weights differ."""
    def winner(i: int, row: np.ndarray, u: np.ndarray) -> int:
        if not raw_race_ok:
            return race(dist(states[i].mask(row)), u)
        p = dist(row)
        tok = race(p, u)
        if states[i].allows(tok):
            return tok
        # the race among the allowed: the best p / E of them, E = -log(1 - u)
        with np.errstate(divide="ignore"):
            score = np.log(p) - np.log(-np.log1p(-u))
        return states[i].best_allowed(score)

    return winner


class LogitRows(Sequence[np.ndarray]):
    """``n`` logit rows of the last batch from batch index ``offset``, read lazily in
    place."""

    def __init__(self, verifier: Model, n: int, offset: int = 0) -> None:
        self._verifier = verifier
        self._n = n
        self._offset = offset

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._verifier._logits_view(self._offset + i)


def grammar_states(state: GrammarState | None,
                    path: list[int]) -> tuple[list[GrammarState], list[int]]:
    """``states[i]``: the grammar after ``path[:i]``; a token it forbids ends the draft
    (returned with the path, cut there). No grammar: no states, the path as it is."""
    states: list[GrammarState] = []
    if state is not None:
        states.append(state)
        for i, t in enumerate(path):
            if not states[-1].allows(t):
                path = path[:i]
                break
            nxt_state = states[-1].copy()
            nxt_state.accept(t)
            states.append(nxt_state)
    return states, path


class Run:
    """One generation's state, from its prompt to its last chunk (``Verifier._generate``)."""

    def __init__(self, verifier: Model, slot: Slot, prompt: list[int],
                 params: GenerateParams, propose: Proposer | None,
                 on_step: StepCallback | None, request: Any) -> None:
        self.slot = slot
        self.prompt = prompt
        self.params = params
        self.propose = propose
        self.on_step = on_step
        self.request = request  # the batcher's Request: its queueing before the first step
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self.t_start = time.perf_counter()
        self.greedy = params.temperature == 0.0
        self.noise = None if self.greedy else SamplingNoise(params.seed, verifier.vocab_size)
        # the grammar after the output so far
        self.state = Grammar(verifier, params.grammar).start() if params.grammar else None
        # With top-k/top-p the constrained distribution is not the raw one renormalised
        # over the allowed tokens, so the raw race winner says nothing: mask every row.
        self.raw_race_ok = params.top_k == 0 and params.top_p >= 1.0
        self.max_tokens = params.max_tokens  # set by the prefill: where the context ends
        self.context = list(prompt)  # prompt + generated so far, what the drafter sees
        self.pending = prompt[-1]  # the last token, not in the KV cache yet
        self.generated = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # the output so far, cut at a stop string
        self.emitted = 0  # characters of ``text`` already sent
        self.max_stop = max((len(s) for s in params.stop), default=0)
        self.t_first: float | None = None
        self.record_before_first = 0.0
        self.finish: str | None = None

    def dist(self, row: np.ndarray) -> np.ndarray:
        """The target distribution of a logit row (temperature, top-k, top-p)."""
        return target_probs(row, self.params.temperature, self.params.top_k,
                            self.params.top_p)

    def text_piece(self, eog: bool) -> str:
        """The text this step releases: up to a tail that could still become a stop
        string, or, at the finish, the rest (the decoder flushed, unless a stop string
        cut the text)."""
        stop, finish = self.params.stop, self.finish
        if finish is None and stop:
            # Hold back a tail that could still become a stop string.
            hold = 0
            for s in stop:
                for j in range(min(len(s) - 1, len(self.text) - self.emitted), 0, -1):
                    if self.text.endswith(s[:j]):
                        hold = max(hold, j)
                        break
            upto = len(self.text) - hold
        else:
            if finish is not None and not (stop and finish == "stop" and not eog):
                self.text += self.decoder.decode(b"", final=True)
            upto = len(self.text)
        piece = self.text[self.emitted:upto] if upto > self.emitted else ""
        self.emitted = max(self.emitted, upto)
        return piece


class Step:
    """One decoding step: the draft, its rows in the shared step, what the target made of
    it."""

    def __init__(self, draft: Any, path: list[int], source: str,
                 states: list[GrammarState], req: StepRows) -> None:
        self.draft = draft  # as the proposer returned it, cut to what the step evaluated
        self.path = path
        self.source = source
        self.states = states  # the grammar after each prefix of the path (grammar_states)
        self.req = req
        self.n_past = req.pos0  # the slot's tokens before the step
        self.accepted = 0
        self.nxt = 0  # the verifier's own token after the accepted draft
        self.gaps: list[TokenGap] = []
        self.new: list[int] = []  # the accepted draft tokens and ``nxt``
        self.out: list[int] = []  # the tokens of ``new`` output (up to a finish)
        self.eog = False  # an end-of-generation token finished the generation


def verdict(run: Run, step: Step, rows: Sequence[np.ndarray]) -> tuple[int, int]:
    """The draft tokens the target accepts and its own next token: greedy, its argmax
    (under the grammar) row by row; sampled, speculative sampling (the grammar's
    constrained race)."""
    path, states = step.path, step.states
    if run.greedy:
        accepted = 0
        nxt = _greedy(rows, states, 0)
        while accepted < len(path) and path[accepted] == nxt:
            accepted += 1
            nxt = _greedy(rows, states, accepted)
        return accepted, nxt
    assert run.noise is not None
    winner = _constrained_winner(states, run.dist, run.raw_race_ok) if states else None
    return speculative_sample(rows, path, run.dist, run.noise, run.generated, winner)
