"""The step planner: which rows of which generations one shared ``llama_decode`` evaluates.

Pure and unit-tested: no threads, nothing of llama.cpp. The batcher (step_batch.py) hands
``plan_step`` every waiting generation's ``StepRows`` before each decode; the plan sets
each one's ``kept``, ``rows``, ``logits`` and ``offset`` and leaves the rest for the next
step.

* Token budget: a row for every decoding sequence's last token, then their drafts
  (arrival order), then prompt chunks fill what is left, so a long new prompt joins the
  step in pieces instead of stalling the others, and no sequence waits a step for
  another's draft. Prompts go first come, first served (``StepRows.since``): a prompt
  that began first gets its chunks first. (Shortest remaining first lowered no turn's
  p95: the longest turns are those with the longest prompts, and it delays them more;
  swe_django, 4 agents on a Zen 3, alternating A/B: p95 31.1 / 35.7 s against 26.9 /
  29.3.)
* Decoding rows ride in prompt steps: a sequence decoding beside a long prompt emits a
  draft's tokens per chunk. Holding prompts back while short decodes finish (shortest
  work first) was built and measured twice on the 2-core Zen 3 (prompt-heavy, 4 agents,
  alternating A/B, 2 and 3 runs a side): wall time, mean turn and turn p95 within the
  runs' spread, as they must be where every row costs the same alone or batched and
  each session's turns fill the whole run (a mean turn is the sessions' end times over
  their turns). Removed; docs/research-log.md has the figures.
* Joint draft lengths: with several decoding sequences, each one's draft is cut to the
  prefix that maximises the step's expected tokens (1 per sequence, plus each draft
  token's calibrated acceptance probability) minus ``rate`` x the step's cost, where
  ``rate`` is the tokens per unit of cost the batcher achieves (Dinkelbach, as the
  drafter does for one sequence; the step's cost depends on the whole batch, so the
  lengths are chosen together over the candidates of every sequence, best first).
* Against the plain plan: a plan with drafts is taken only where it yields at least the
  plain plan's expected tokens per unit of cost (``joint_lengths``).
* Priced as the step it will be (opt-in: ``model``, the batcher's ``use_model``):
  llama.cpp splits a shared step into ubatches (step_cost.py); the step cost model,
  fitted to every step served, prices each candidate plan under its cheapest layout (no
  padding, runs padded, or the drafting runs padded) and the plan takes that layout.
  Off, the profile prices the step's ubatches (``_Groups``), or, past
  GROUPED_MAX_SEQUENCES and in deterministic mode, its rows with every run padded.
* Equal rows per sequence: with a KV stream per sequence, llama.cpp splits a batch into
  ubatches holding the same number of rows of consecutive sequence ids; unequal drafts
  would cost one ubatch each. Rows are padded (no logits, rolled back with the rejected
  draft) to the longest of their ubatch (``_Groups``: the cheapest cut of each run of
  consecutive ids into intervals) or of their run, which on the 2-core CPU measured
  costs a padded row about PAD_ROW_WEIGHT of a row with logits (the 262k-wide output
  layer runs only for rows with logits).
* Logits where they make the ubatch cheaper: llama.cpp's CPU output layer takes rows with
  logits in blocks of 4 and each left-over row in a pass of its own (8 rows with 7
  logits cost 62 ms on the 2-core EPYC, with 8 logits 43 ms). Where the profile measured
  the padded shape cheaper with logits on every row (``logit_rows``), a run's padding
  rows ask for logits too (read by no one).
* Whole decodes: no decoding sequence's rows span two ubatches (``_keep_decodes_whole``);
  in deterministic mode no ubatch takes a single row of a sequence
  (``_no_single_row_ubatches``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .step_cost import PAD_ROW_WEIGHT, Entry, StepCostModel, split_equal

# A prompt chunk's share of a step when decoding rows would fill it: prompts still move.
PROMPT_RESERVE = 64


@dataclass(eq=False)
class StepRows:
    """What one sequence wants evaluated in a step, and what the step gave it."""

    seq_id: int
    tokens: list[int]  # a decode: [last token, *draft]; a prompt chunk: prompt tokens
    pos0: int
    room: int  # the most rows this sequence may take (the end of its context, n_batch)
    prompt: bool = False  # a prompt chunk: no logits; the plan may take only its head
    # A decode's draft tokens' calibrated cumulative acceptance probabilities: the plan
    # may cut the draft (None: the draft is kept whole)
    probs: Sequence[float] | None = None
    # Rows its drafter chose for a step of its own (0: all of ``tokens``). A shared step's
    # plan may take more of ``tokens`` (the candidates past the drafter's cut) where they
    # fill rows that would be padding anyway, or fewer.
    want: int = 0
    # set by the plan and the step
    kept: int = 0  # tokens of ``tokens`` evaluated
    rows: int = 0  # rows evaluated, padding included
    # rows with logits: a decode's kept rows, and padding rows after them where the
    # ubatch reaches a shape that is cheaper with logits on every row (0: the kept ones)
    logits: int = 0
    offset: int = 0  # batch index of its first row
    shared: int = 0  # sequences in the step
    step_s: float = 0.0  # the decode's duration
    emitted: int = 0  # set by the sequence after verifying: tokens it emitted
    arrived: float = 0.0
    # a prompt chunk: when its prompt's first chunk was offered (time.monotonic). Prompts
    # are served first come, first served by it, not by when each chunk came back: each
    # chunk re-queues behind the others, so several long prompts otherwise took turns
    # and all finished together, at the last one's time.
    since: float = 0.0
    done: bool = False
    error: BaseException | None = None
    decode_started: float = 0.0  # monotonic time its step's decode began

    @property
    def outputs(self) -> int:
        """Rows with logits: every kept row of a decode (and ``logits`` padding rows
        past them), none of a prompt chunk."""
        return 0 if self.prompt else max(self.kept, min(self.logits, self.rows))



def step_cost(cost: Callable[[int], float], rows: Sequence[int], outputs: Sequence[int]) -> float:
    """The modelled cost of a step: its verified rows at the profile's cost, its padding
    rows at PAD_ROW_WEIGHT of what they would add as verified rows."""
    return _cost_of(cost, sum(rows), sum(outputs))


def ubatch_cost(cost: Callable[[int], float], decodes: Sequence[StepRows],
                n_ubatch: int) -> float:
    """A step's decoding rows priced per ubatch of llama.cpp's split (``decodes`` in batch
    order): each ubatch's rows as ``step_cost`` prices them."""
    entries = [Entry(r.seq_id, r.rows, r.kept, r.pos0) for r in decodes]
    total = 0.0
    for u in split_equal(entries, n_ubatch):
        rows = u.depth * len(u.members)
        out = sum(max(0, min(entries[i].outputs, f + u.depth) - f)
                  for i, f in zip(u.members, u.first, strict=True))
        total += _cost_of(cost, rows, out)
    return total


def _cost_of(cost: Callable[[int], float], total: int, out: int) -> float:
    """step_cost from the step's row and output totals."""
    base = cost(out) if out else 0.0
    return base + PAD_ROW_WEIGHT * (cost(total) - base) if total > out else base


def _padded(kept: int, longest: int, room: int) -> int:
    """Rows of a request whose run of consecutive ids is padded to ``longest``."""
    return max(kept, min(longest, room))


def _runs(reqs: Sequence[StepRows]) -> list[list[StepRows]]:
    """Decoding requests grouped into runs of consecutive sequence ids."""
    runs: list[list[StepRows]] = []
    for r in sorted(reqs, key=lambda r: r.seq_id):
        if runs and r.seq_id == runs[-1][-1].seq_id + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs


def _pad_plan(reqs: Sequence[StepRows]) -> Callable[[Sequence[int]], list[int]]:
    """Rows per request, given the kept ones, once each run of consecutive ids is padded
    to its longest (the runs found once: the joint plan asks for every candidate)."""
    idx = {id(r): i for i, r in enumerate(reqs)}
    runs = [[idx[id(r)] for r in run] for run in _runs(reqs)]
    rooms = [r.room for r in reqs]

    def rows(kept: Sequence[int]) -> list[int]:
        out = list(kept)
        for run in runs:
            longest = max(kept[i] for i in run)
            for i in run:
                out[i] = _padded(kept[i], longest, rooms[i])
        return out

    return rows


def padded_rows(reqs: Sequence[StepRows], kept: Sequence[int]) -> list[int]:
    """Rows per request once each run of consecutive ids is padded to its longest."""
    return _pad_plan(reqs)(kept)


def cheapest_layout(reqs: Sequence[StepRows], kept: Sequence[int],
                    model: StepCostModel) -> tuple[float, list[int]]:
    """The layout of ``kept`` the model prices lowest, and its price."""
    return _Layouts(reqs, model).cheapest(kept)


class _Layouts:
    """Prices a shared decoding step's layouts (``_sorted_layouts``): the sequences sorted and
    their runs found once, the profile memoised, each candidate plan priced in the
    model's written-out loop (the joint plan asks for every one)."""

    def __init__(self, reqs: Sequence[StepRows], model: StepCostModel) -> None:
        self.reqs = reqs
        self.model = model
        self.order = sorted(range(len(reqs)), key=lambda i: reqs[i].seq_id)
        self.ids = [reqs[i].seq_id for i in self.order]
        self.pos0 = [reqs[i].pos0 for i in self.order]
        self.rooms = [reqs[i].room for i in self.order]
        self.runs: list[range] = []  # runs of consecutive ids, in sorted positions
        start = 0
        for k in range(1, len(self.ids) + 1):
            if k == len(self.ids) or self.ids[k] != self.ids[k - 1] + 1:
                self.runs.append(range(start, k))
                start = k
        memo: dict[int, float] = {}
        raw = model.cost

        def cost(n: int) -> float:
            got = memo.get(n)
            if got is None:
                got = memo[n] = raw(n)
            return got

        self._cost = cost

    def _price(self, rows: list[int], kept: list[int]) -> float:
        ends = [p + n for p, n in zip(self.pos0, rows, strict=True)]
        return self.model.price_sorted(self.ids, rows, kept, ends, self._cost)

    def _sorted_layouts(self, kept: list[int]) -> list[list[int]]:
        """Ways to lay out the kept rows (padding the rest): none (each sequence its kept
        rows; llama.cpp then splits unequal rows into more ubatches), every run of
        consecutive ids padded to its longest (one ubatch a run), and each run of
        consecutive sequences that draft padded to its longest (the one-row sequences
        share the first ubatch, the drafting ones as few more as their ids allow)."""
        rooms = self.rooms
        padded = list(kept)
        for run in self.runs:
            longest = max(kept[i] for i in run)
            for i in run:
                padded[i] = _padded(kept[i], longest, rooms[i])
        out = [kept, padded]
        drafting = [i for i in range(len(kept)) if kept[i] > 1]
        if drafting and len(drafting) < len(kept):
            third = list(kept)
            start = 0
            for k in range(1, len(drafting) + 1):
                if k == len(drafting) or \
                        self.ids[drafting[k]] != self.ids[drafting[k - 1]] + 1:
                    part = drafting[start:k]
                    longest = max(kept[i] for i in part)
                    for i in part:
                        third[i] = _padded(kept[i], longest, rooms[i])
                    start = k
            if third != kept and third != padded:
                out.append(third)
        return out

    def cheapest_sorted(self, kept: list[int]) -> tuple[float, list[int]]:
        best: tuple[float, list[int]] | None = None
        for rows in self._sorted_layouts(kept):
            price = self._price(rows, kept)
            if best is None or price < best[0]:
                best = (price, rows)
        assert best is not None
        return best

    def cheapest(self, kept: Sequence[int]) -> tuple[float, list[int]]:
        """In the requests' own order."""
        price, rows = self.cheapest_sorted([kept[i] for i in self.order])
        out = [0] * len(rows)
        for k, i in enumerate(self.order):
            out[i] = rows[k]
        return price, out


# Sequences up to which a step's decoding ubatches are chosen by ``_Groups``' dynamic
# program (O(sequences^2) a candidate plan); past it every run of consecutive ids is
# padded to one ubatch, as in a step with prompt chunks.
GROUPED_MAX_SEQUENCES = 8


class _Groups:
    """A step's decodes laid out in ubatches of their own choosing: llama.cpp's sequential
    split takes a ubatch's sequences as a run of consecutive ids starting at the first
    row not yet taken, in batch order, so any partition of each run of consecutive ids
    into intervals is a layout (the intervals placed in descending order of their first
    id, none joins the next). Each interval is padded to its longest and priced as one
    ubatch: the profile's cost of its rows, padding at PAD_ROW_WEIGHT. A dynamic program
    over the sequences (by id) finds the cheapest partition.

    Why: padding a whole run to its longest draft made one sequence's sure 27-token copy
    cost its 7 neighbours 20 padding rows each (spider_dev, 8 agents, a 2-core Zen 3:
    1.1-1.3 s steps, 2,062 padding rows of 4,396); in a ubatch of its own it costs its
    own rows and one ubatch more."""

    def __init__(self, reqs: Sequence[StepRows], cost: Callable[[int], float],
                 n_ubatch: int) -> None:
        self.order = sorted(range(len(reqs)), key=lambda i: reqs[i].seq_id)
        ids = [reqs[i].seq_id for i in self.order]
        self.rooms = [reqs[i].room for i in self.order]
        self.n_ubatch = n_ubatch
        n = len(ids)
        # the first position a ubatch ending at position j may start from
        self.lo = [0] * n
        for j in range(1, n):
            self.lo[j] = self.lo[j - 1] if ids[j] == ids[j - 1] + 1 else j
        self._cost = cost
        self.table: list[float] = [0.0]  # cost(k), filled as far as asked
        self.f = [0.0] * (n + 1)  # f[j]: the cheapest layout of positions 0..j-1
        self.cut = [0] * (n + 1)  # where the last ubatch of that layout starts

    def _grow(self, k: int) -> list[float]:
        t = self.table
        t.extend(self._cost(x) for x in range(len(t), 2 * k + 1))
        return t

    def solve(self, kept: Sequence[int], start: int = 0) -> float:
        """The cheapest layout's price for ``kept`` (in id order), recomputed from the
        ubatches that end past position ``start`` (those before it are unchanged)."""
        f, cut, rooms, lo, t = self.f, self.cut, self.rooms, self.lo, self.table
        cap, w, size = self.n_ubatch, PAD_ROW_WEIGHT, len(self.table)
        for j in range(start + 1, len(kept) + 1):
            i = j - 1
            longest = out = kept[i]
            low_room = rooms[i]
            if longest >= size:
                t = self._grow(longest)
                size = len(t)
            best, at = f[i] + t[out], i
            for i in range(j - 2, lo[j - 1] - 1, -1):
                k = kept[i]
                out += k
                if k > longest:
                    longest = k
                if rooms[i] < low_room:
                    low_room = rooms[i]
                rows = longest * (j - i)
                if rows > cap or low_room < longest:
                    # a sequence that cannot be padded to the others' rows would leave
                    # them spanning two ubatches; a wider ubatch cannot hold fewer rows
                    break
                if rows >= size:
                    t = self._grow(rows)
                    size = len(t)
                base = t[out]
                v = f[i] + base + w * (t[rows] - base)
                if v <= best:
                    best, at = v, i
            f[j] = best
            cut[j] = at
        return f[len(kept)]

    def groups(self, n: int) -> list[range]:
        """The last solved layout's ubatches, as ranges of positions (in id order)."""
        out: list[range] = []
        j = n
        while j > 0:
            out.append(range(self.cut[j], j))
            j = self.cut[j]
        return out[::-1]

    def layout(self, kept: Sequence[int]) -> tuple[list[int], list[int]]:
        """For ``kept`` in the requests' own order: each request's rows (padded to its
        ubatch's longest) and its ubatch's index, the ubatches numbered in batch order
        (descending first id, so that llama.cpp's split keeps them apart)."""
        skept = [kept[i] for i in self.order]
        self.solve(skept)
        groups = self.groups(len(skept))
        rows = [0] * len(kept)
        which = [0] * len(kept)
        for g_index, g in enumerate(reversed(groups)):
            longest = max(skept[x] for x in g)
            for x in g:
                rows[self.order[x]] = longest
                which[self.order[x]] = g_index
        return rows, which


def _joint_lengths_grouped(reqs: Sequence[StepRows], cost: Callable[[int], float],
                           rate: float, n_ubatch: int) -> list[int]:
    """``joint_lengths`` with each candidate plan priced under its cheapest ubatch layout
    (``_Groups``, re-solved from the sequence that changed). Candidates below ``rate`` x
    the cheapest a row can add (a padding row turned into one with logits, at the
    profile's mean slope) are not priced: a bound for the plan's time (up to 256
    candidates at 8 sequences), as the modelled plan has."""
    lay = _Groups(reqs, cost, n_ubatch)
    top = max(2, max((len(r.tokens) for r in reqs), default=2))
    slope = max(0.0, (cost(top) - cost(1)) / (top - 1))
    return _best_prefix(reqs, rate, lay.order, lay.solve, (1.0 - PAD_ROW_WEIGHT) * slope)


def _best_prefix(reqs: Sequence[StepRows], rate: float, order: Sequence[int],
                 price: Callable[[list[int], int], float], row_floor: float) -> list[int]:
    """The joint rule over a layout-priced step: ``price(kept, p)`` is the step's price for
    ``kept`` in ``order``'s positions, position ``p`` the one changed since the last call
    (0 the first time). Candidates below ``rate`` x ``row_floor`` are not priced."""
    kept, cands = _candidates(reqs)
    pos = {i: k for k, i in enumerate(order)}
    skept = [kept[i] for i in order]  # kept in the layout's positions
    plain_tokens = float(sum(kept))
    plain_cost = price(skept, 0)
    if plain_cost > 0:
        rate = max(rate, plain_tokens / plain_cost)
    expected = float(len(reqs))
    best, best_kept = expected - rate * plain_cost, list(kept)
    floor = rate * row_floor
    for neg_p, j, i in cands:
        if kept[i] != j + 1:
            continue
        if -neg_p < floor:
            break
        kept[i] += 1
        skept[pos[i]] += 1
        expected -= neg_p
        v = expected - rate * price(skept, pos[i])
        if v > best:
            best, best_kept = v, list(kept)
    return best_kept


def _candidates(reqs: Sequence[StepRows]) -> tuple[list[int], list[tuple[float, int, int]]]:
    """The plain plan's rows (1 per estimated draft; a draft without estimates kept as it
    is) and every draft token as a candidate (-probability, index in its draft, request),
    most probable first."""
    kept = [1 if r.probs is not None else r.kept for r in reqs]
    cands: list[tuple[float, int, int]] = []
    for i, r in enumerate(reqs):
        if r.probs is None:
            continue
        low = 1.0
        for j, p in enumerate(r.probs[: r.kept - 1]):
            low = min(low, float(p))  # a token is accepted only after those before it
            cands.append((-low, j, i))
    cands.sort()
    return kept, cands


def _joint_lengths_modelled(reqs: Sequence[StepRows], rate: float,
                            model: StepCostModel) -> list[int]:
    """``joint_lengths`` with each candidate plan priced by the step cost model under its
    cheapest layout (padding, ubatch splits, sequences sharing a ubatch). Candidates
    below what the cheapest row adds (on the profile's average slope) are not priced: a
    bound for the time a plan takes, not for its value."""
    lay = _Layouts(reqs, model)
    return _best_prefix(reqs, rate, lay.order, lambda kept, _p: lay.cheapest_sorted(kept)[0],
                        model.cheapest_row())


def joint_lengths(reqs: Sequence[StepRows], cost: Callable[[int], float],
                  rate: float, model: StepCostModel | None = None,
                  grouped_ubatch: int | None = None) -> list[int]:
    """Rows kept per decoding request (1 + draft tokens, at most its ``kept``), chosen
    together: the prefix of all candidates, most probable first, that maximises
    expected tokens - rate * cost.

    The plan is chosen against the plain plan (one row per sequence, no draft): ``rate``
    is raised to at least the plain plan's own tokens per cost, so that any plan taken
    instead yields at least as many expected tokens per unit of cost (taking x over the
    plain plan 0 means E(x) - E(0) >= rate * (C(x) - C(0)) >= E(0)/C(0) * (C(x) - C(0)),
    that is E(x)/C(x) >= E(0)/C(0)). With a low achieved ``rate`` (drafts that did not pay
    lately) the bare objective took drafts that cost more per token than plain batching.

    ``model``: the step cost model fitted while serving: each candidate plan is then
    priced as the step it would be (``cheapest_layout``), instead of by its rows on the
    one-sequence profile with every run of consecutive ids padded.

    The step's rows are kept up to date per candidate (each run's longest kept and its
    padded rows) instead of padding every sequence again: O(candidates + sequences x
    draft) rather than O(candidates x sequences), which at a GPU's 16-64 sequences was
    8-170 ms a plan.

    ``grouped_ubatch`` (llama.cpp's ``n_ubatch``; not in deterministic mode): each candidate plan
    is priced under the cheapest ubatch layout of ``_Groups`` instead, which the step
    then takes (``plan_step``)."""
    if model is not None:
        return _joint_lengths_modelled(reqs, rate, model)
    if grouped_ubatch is not None and len(reqs) <= GROUPED_MAX_SEQUENCES:
        return _joint_lengths_grouped(reqs, cost, rate, grouped_ubatch)
    kept, cands = _candidates(reqs)
    idx = {id(r): i for i, r in enumerate(reqs)}
    runs = [[idx[id(r)] for r in run] for run in _runs(reqs)]
    run_of = [0] * len(reqs)
    for k, run in enumerate(runs):
        for i in run:
            run_of[i] = k
    rooms = [r.room for r in reqs]
    longest = [max(kept[i] for i in run) for run in runs]

    def rows_of(i: int) -> int:
        return _padded(kept[i], longest[run_of[i]], rooms[i])

    outputs = sum(kept)
    total = sum(rows_of(i) for i in range(len(reqs)))

    def step_price() -> float:
        return _cost_of(cost, total, outputs)

    # the drafts kept whole add a constant to the expected tokens: left out, except in
    # the plain plan's own rate, where they count as the rows they are
    expected = float(len(reqs))
    plain_tokens = sum(1.0 if r.probs is not None else float(k) for r, k in zip(
        reqs, kept, strict=True))
    plain_cost = step_price()
    if plain_cost > 0:
        rate = max(rate, plain_tokens / plain_cost)

    def value(expected: float) -> float:
        return expected - rate * step_price()

    start = list(kept)
    taken: list[int] = []  # the candidates added, in order (their sequences)
    best, best_n = value(expected), 0
    for neg_p, j, i in cands:
        if kept[i] != j + 1:  # a draft is a path: its tokens come in order
            continue
        taken.append(i)
        run = runs[run_of[i]]
        if kept[i] + 1 > longest[run_of[i]]:  # the run's padding grows with it
            before = sum(rows_of(m) for m in run)
            kept[i] += 1
            longest[run_of[i]] = kept[i]
            total += sum(rows_of(m) for m in run) - before
        else:
            before = rows_of(i)
            kept[i] += 1
            total += rows_of(i) - before
        outputs += 1
        expected -= neg_p
        v = value(expected)
        if v > best:
            best, best_n = v, len(taken)
    for i in taken[:best_n]:
        start[i] += 1
    return start


def plan_step(pending: Sequence[StepRows], n_batch: int, cost: Callable[[int], float],
              rate: float, pad_to: Callable[[int, int], int] | None = None,
              model: StepCostModel | None = None,
              logit_rows: Callable[[int, int], int] | None = None,
              n_ubatch: int | None = None, no_single_rows: bool = False) -> list[StepRows]:
    """Choose this step's requests and set their ``kept``, ``rows`` and ``offset``; the
    rest wait for the next step. Never empty when ``pending`` is not. ``no_single_rows``
    (the verifier's deterministic mode): no ubatch takes one row of a sequence
    (``_no_single_row_ubatches``)."""
    decodes = [r for r in pending if not r.prompt]
    prompts = sorted((r for r in pending if r.prompt), key=lambda r: r.since)
    budget = n_batch - (min(PROMPT_RESERVE, n_batch // 2) if prompts else 0)
    # The decodes choose their ubatches (``_Groups``), and prompt chunks go after them in
    # batch order. In id order a chunk bridged the ids around it: its first row joined
    # the decodes' ubatch at a depth of one row, and every draft beside a prompt was cut
    # to that row (swe_django, 4 agents, Zen 3: mixed steps 17% dearer than the same rows
    # apart). Deterministic mode keeps id order (its single-row rule is for that split).
    grouped = n_ubatch or n_batch if model is None and not no_single_rows else None
    # every decoding sequence's last token first (none waits a step for another's
    # draft), then the drafts in arrival order with what the budget leaves
    chosen = [r for r in decodes if r.room >= 1][:max(budget, 1)]
    used = len(chosen)
    for r in chosen:
        draft = min(len(r.tokens), r.room) - 1
        r.kept = 1 + min(draft, max(0, budget - used))
        used += r.kept - 1
    if len(chosen) > 1:
        for r, k in zip(chosen, joint_lengths(chosen, cost, rate, model, grouped),
                        strict=True):
            r.kept = min(r.kept, k)
    else:
        for r in chosen:  # a step of its own: as its drafter chose
            r.kept = min(r.kept, r.want or r.kept)
    kept = [r.kept for r in chosen]
    ubatch_of: dict[int, int] = {}  # a grouped step's ubatch per request (batch order)
    if model is not None and len(chosen) > 1:
        rows = cheapest_layout(chosen, kept, model)[1]
    elif grouped is not None and 1 < len(chosen) <= GROUPED_MAX_SEQUENCES:
        rows, which = _Groups(chosen, cost, grouped).layout(kept)
        ubatch_of = {id(r): g for r, g in zip(chosen, which, strict=True)}
    else:
        rows = padded_rows(chosen, kept)
    if len(chosen) == 1 and pad_to is not None:
        # one sequence: pad to a cheaper measured batch shape, as a lone step always did
        rows[0] += pad_to(rows[0], chosen[0].room)
    # padding must stay within the budget: drop it where it would not
    for i in range(len(rows) - 1, -1, -1):
        if sum(rows) <= n_batch:
            break
        rows[i] = chosen[i].kept
    for r, n in zip(chosen, rows, strict=True):
        r.rows = n
        r.logits = r.kept
    # in batch order: a grouped step's ubatches by descending first id (none joins the
    # next), otherwise by id
    chosen.sort(key=lambda r: (ubatch_of.get(id(r), 0), r.seq_id))
    if logit_rows is not None:
        _ask_padding_logits(chosen, logit_rows)
    used = sum(rows)
    for r in prompts:
        left = n_batch - used
        if left <= 0:
            break
        r.kept = r.rows = min(len(r.tokens), left, r.room)
        if r.kept < 1:
            continue
        chosen.append(r)
        used += r.rows
    if not chosen and pending:  # nothing fits the budget: the first request alone
        r = pending[0]
        r.kept = r.rows = max(1, min(len(r.tokens), r.room, n_batch))
        chosen.append(r)
    if not ubatch_of:
        # by sequence id, prompt chunks included: llama.cpp's split takes runs of
        # consecutive ids in batch order, so a prompt's first row shares the decoding
        # rows' ubatch
        chosen.sort(key=lambda r: r.seq_id)
    elif prompts:
        # the decodes' ubatches, then the chunks by id: a chunk joins at most the ubatch
        # of the decodes just below its id, at their depth
        n_dec = len(ubatch_of)
        chosen[n_dec:] = sorted(chosen[n_dec:], key=lambda r: r.seq_id)
    if _keep_decodes_whole(chosen, n_ubatch or n_batch) and logit_rows is not None:
        _ask_padding_logits([r for r in chosen if not r.prompt], logit_rows)
    if no_single_rows:
        chosen = _no_single_row_ubatches(chosen, n_batch, n_ubatch or n_batch)
    offset = 0
    for r in chosen:
        r.offset = offset
        r.shared = len(chosen)
        offset += r.rows
    return chosen


def _keep_decodes_whole(batch: list[StepRows], n_ubatch: int) -> bool:
    """Cut every decoding sequence whose rows llama.cpp would split over more than one
    ubatch to the rows of its first (its draft shortened, or its padding): a decode whose
    draft spans ubatches and is rolled back parts from plain decoding by far more than a
    near-tie (bench/batched_certify.py: 24 of 24 turns diverged with every run left
    unpadded; with the padded plan 5-18 of 24-48, where a short prompt chunk or a run's
    dropped padding cut a run's ubatch; none once no decode spans two). ``batch``: in
    batch order. Returns whether it cut any."""
    any_cut = False
    while True:
        entries = [Entry(r.seq_id, r.rows, r.outputs, r.pos0, r.prompt) for r in batch]
        first: dict[int, int] = {}
        spans: dict[int, int] = {}
        for u in split_equal(entries, n_ubatch):
            for i in u.members:
                first.setdefault(i, u.depth)
                spans[i] = spans.get(i, 0) + 1
        cut = False
        for i, r in enumerate(batch):
            if not r.prompt and spans.get(i, 0) > 1:
                r.rows = first[i]
                r.kept = min(r.kept, r.rows)
                r.logits = min(r.logits, r.rows)
                cut = any_cut = True
        if not cut:
            return any_cut


def _single_row_ubatches(batch: Sequence[StepRows], n_ubatch: int) -> list[tuple[int, int]]:
    """(index in ``batch``, rows it has left there) of every member of a ubatch of
    llama.cpp's split that takes a single row of each of its sequences."""
    entries = [Entry(r.seq_id, r.rows, r.outputs, r.pos0, r.prompt) for r in batch]
    return [(i, batch[i].rows - first)
            for u in split_equal(entries, n_ubatch) if u.depth == 1
            for i, first in zip(u.members, u.first, strict=True)]


def _no_single_row_ubatches(batch: list[StepRows], n_batch: int,
                            n_ubatch: int) -> list[StepRows]:
    """The step with no ubatch taking a single row of a sequence (``batch`` in batch
    order; returns the requests the step keeps).

    Deterministic mode: ggml-cpu multiplies one row of activations by other kernels than
    two or more (``llamafile_sgemm`` declines n < 2 and ggml's vec_dot, which sums in
    another order, runs; for attention n is a sequence's rows in the ubatch), so such a row's
    logits and K/V would differ in their last bits from the same position's in any other
    batch shape (bench/batch_invariance_probe.py). A sequence with one row left where its
    ubatch takes one is padded by a row (a prompt chunk's padding is rolled back after
    the decode, as a decode's is), or, where the budget has no room, loses a padding row
    or a prompt row; after each change the split is looked at again. If that does not
    settle, the first request runs alone, two rows at least."""
    for _ in range(4 * len(batch) + 4):
        _keep_decodes_whole(batch, n_ubatch)
        lone = [(i, left) for i, left in _single_row_ubatches(batch, n_ubatch) if left == 1]
        if not lone:
            return batch
        used = sum(r.rows for r in batch)
        for i, _left in lone:
            r = batch[i]
            if used < n_batch and r.rows < max(r.room, 2):
                r.rows += 1
                used += 1
            elif r.rows > r.kept:
                r.rows -= 1
                r.logits = min(r.logits, r.rows)
                used -= 1
            elif r.prompt and r.kept > 1:
                r.kept -= 1
                r.rows -= 1
                used -= 1
        batch = [r for r in batch if r.rows > 0]
    first = batch[0]
    first.rows = max(2, min(first.rows, n_ubatch))
    first.kept = min(first.kept, first.rows)
    first.logits = min(first.logits, first.rows)
    return [first]


def _ubatch_runs(decodes: Sequence[StepRows]) -> list[list[StepRows]]:
    """Decoding requests grouped as llama.cpp's split groups them: runs of consecutive
    ids in batch order."""
    runs: list[list[StepRows]] = []
    for r in decodes:
        if runs and r.seq_id == runs[-1][-1].seq_id + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    return runs


def _ask_padding_logits(decodes: Sequence[StepRows],
                        logit_rows: Callable[[int, int], int]) -> None:
    """Per run of consecutive ids in batch order (one ubatch once padded):
    ``logit_rows(verified, rows)`` rows ask for logits, the extra ones on the run's
    padding rows."""
    for run in _ubatch_runs(decodes):
        extra = logit_rows(sum(r.kept for r in run), sum(r.rows for r in run)) \
            - sum(r.kept for r in run)
        for r in run:
            add = max(0, min(extra, r.rows - r.kept))
            r.logits = r.kept + add
            extra -= add
