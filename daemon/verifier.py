"""The colocated verifier: speculative decoding over llama-cpp-python's low-level API.

One step of generation evaluates, in a single ``llama_decode`` batch, the last
accepted token (not yet in the KV cache) followed by the whole draft, with
logits for every position. The target accepts the longest draft prefix it
agrees with and adds its own next token (the "bonus" token); the rejected tail
is removed from the KV cache with ``llama_memory_seq_rm``.

Losslessness:

* temperature 0: the accepted prefix is exactly what greedy decoding of the
  same logits picks, so the output equals plain decoding, up to llama.cpp's
  batch-shape dependent rounding (see ``NEAR_TIE_GAP``).
* temperature > 0: a deterministic draft token ``x`` is accepted with
  probability ``p(x)``; on rejection the token is drawn from ``p`` with ``x``
  removed and renormalised. This is speculative sampling with a point-mass
  proposal, so every emitted token has exactly the target distribution ``p``
  (temperature, then top-k, then top-p, as vLLM and Hugging Face order them).

Sessions keep their KV cache between turns: each session owns one sequence id
of a unified KV cache ("slot") and a new prompt only pays for the tokens after
its longest common prefix with what the slot already holds. Several sessions
share the model through a FIFO turn queue taken once per ``llama_decode`` so a
long generation cannot starve the others.

The verifier knows nothing about suffix trees: it takes a ``propose(context,
k)`` callable, so it runs as well with the suffixcache Drafter, a draft model,
prompt lookup or a scripted drafter in tests.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .model import extra_weight_buffers

log = logging.getLogger("suffixd.verifier")

# Largest top-1/top-2 logit gap that llama.cpp's batch-shape rounding can flip on
# this CPU. Evaluating the same tokens in batches of 1, 4, 9 and 17 (5 spider
# prompts, 48 generated tokens each) changed single logits by up to 1.74 and the
# top-1/top-2 gap by up to 0.95 (Gemma's logits span ~+-30; Q4_K kernels quantise
# activations differently per batch shape). The threshold is twice the largest
# gap drift, rounded up; tests/test_verifier.py re-measures the drift and fails
# if it ever exceeds this. A greedy output that parts from plain decoding where
# the gap is larger is reported as a real divergence.
NEAR_TIE_GAP = 2.0


class DraftLike(Protocol):
    tokens: list[int]
    source: str

    def path(self) -> list[int]: ...


Proposer = Callable[[list[int], int], "DraftLike | Sequence[int] | None"]
# on_step(draft, accepted, new): ``new`` is the accepted draft tokens and the verifier's own
# next token after them.
StepCallback = Callable[[Any, int, list[int]], None]


class ContextOverflowError(ValueError):
    """The prompt (plus what must be generated) does not fit the context window."""


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
class TokenGap:
    """What the target's logits said at one generated position (greedy runs only)."""

    token: int
    top1: int
    top2: int
    gap: float  # logit(top1) - logit(top2)
    top: list[tuple[int, float]] = field(default_factory=list)  # best TOP_RECORDED (id, logit)
    # The llama_decode batch these logits came from: its first position, its tokens and
    # the row, so a divergence can be re-evaluated with exactly the same batch shape.
    pos0: int = -1
    batch: tuple[int, ...] = ()
    row: int = -1

    def shortfall(self, token: int) -> float:
        """How far ``token``'s logit is below the best one (inf if not among the recorded)."""
        for t, logit in self.top:
            if t == token:
                return self.top[0][1] - logit
        return float("inf")


# Enough candidates that, where many tokens are within a logit of each other, the other
# run's choice is still among them: with 8, a run once parted from plain decoding where
# plain's token had dropped out of its 8 best, and the parting could not be judged.
TOP_RECORDED = 32


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens reused from the session's KV cache
    completion_tokens: int = 0
    steps: int = 0  # verifier evaluations during decoding
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    prompt_s: float = 0.0  # prompt processing
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


def _draft_path(draft: Any) -> tuple[list[int], str]:
    if draft is None:
        return [], "none"
    if hasattr(draft, "path"):
        return [int(t) for t in draft.path()], str(getattr(draft, "source", "none"))
    return [int(t) for t in draft], "draft"


def target_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The sampling distribution over the vocabulary: temperature, then top-k, then top-p."""
    z = logits.astype(np.float64) / temperature
    n = z.shape[0]
    if 0 < top_k < n:
        keep = np.argpartition(-z, top_k - 1)[:top_k]
        masked = np.full(n, -np.inf)
        masked[keep] = z[keep]
        z = masked
    z = z - np.max(z)
    p = np.exp(z)
    p /= p.sum()
    if top_p < 1.0:
        # The nucleus almost always lives in the few hundred best tokens; sort only those.
        m = min(n, 1024)
        cand = np.argpartition(-p, m - 1)[:m] if m < n else np.arange(n)
        cand = cand[np.argsort(-p[cand], kind="stable")]
        cum = np.cumsum(p[cand])
        if cum[-1] < top_p and m < n:
            cand = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[cand])
        cut = int(np.searchsorted(cum, top_p)) + 1  # smallest prefix with mass >= top_p
        out = np.zeros(n)
        out[cand[:cut]] = p[cand[:cut]]
        p = out / out.sum()
    return p


def speculative_sample(
    rows: Sequence[np.ndarray] | np.ndarray,
    draft: Sequence[int],
    rng: np.random.Generator,
    dist: Callable[[np.ndarray], np.ndarray],
) -> tuple[int, int]:
    """Exact speculative sampling for a deterministic draft.

    ``rows[i]`` are the target logits after ``draft[:i]``; returns (accepted,
    next token). Draft token x at position i is kept with probability p_i(x);
    the first rejected one is replaced by a draw from p_i without x,
    renormalised; if every draft token is kept the bonus is a draw from p_k.
    """
    for i, x in enumerate(draft):
        p = dist(rows[i])
        px = float(p[x])
        if rng.random() < px:
            continue
        p = p.copy()
        p[x] = 0.0
        return i, _draw(p, rng)
    return len(draft), _draw(dist(rows[len(draft)]), rng)


def _draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from the (unnormalised) weights ``p``, over its support only."""
    support = np.flatnonzero(p)
    cdf = np.cumsum(p[support])
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(support[min(i, len(support) - 1)])


# A bigger batch shape is used in place of a smaller one only when it is at least this
# much cheaper, so that measurement noise does not make every batch a padded one.
PAD_MARGIN = 0.95
# Weight of each new verification step in the serving cost averages (~30 steps' memory).
LIVE_COST_ALPHA = 0.03
# Rounds of the cost measurement while it still looks load-distorted (see
# measure_cost_profile); one round of 33 sizes takes about 1.5 s here.
MAX_PROFILE_ROUNDS = 8


def _plausible(samples: dict[int, list[float]]) -> bool:
    """Whether the fastest one-token time is at most every other size's fastest time."""
    if 1 not in samples or not samples[1]:
        return True
    one = min(samples[1])
    return all(min(v) >= one for k, v in samples.items() if v and k > 1)


def plan_batch_shapes(seconds: dict[int, float]) -> tuple[dict[int, int], dict[int, float]]:
    """From measured seconds per batch size: which sizes to pad to a cheaper, larger
    measured size, and the cost of every size after padding (the lower envelope)."""
    sizes = sorted(seconds)
    pad_to: dict[int, int] = {}
    effective: dict[int, float] = {}
    for i, n in enumerate(sizes):
        best = min(sizes[i:], key=lambda j: (seconds[j], j))
        # One token (plain decoding) takes llama.cpp's vector path and is never padded:
        # a larger batch measuring cheaper than it is load noise, not a kernel effect.
        if n > 1 and best != n and seconds[best] < PAD_MARGIN * seconds[n]:
            pad_to[n] = best
            effective[n] = seconds[best]
        else:
            effective[n] = seconds[n]
    return pad_to, effective


class _LogitRows(Sequence[np.ndarray]):
    """The first ``n`` logit rows of the last batch, read lazily in place."""

    def __init__(self, verifier: Verifier, n: int) -> None:
        self._verifier = verifier
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> np.ndarray:  # type: ignore[override]
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._verifier._logits_view(i)


def _token_gap(row: np.ndarray, token: int) -> TokenGap:
    best = np.argpartition(-row, TOP_RECORDED)[:TOP_RECORDED]
    best = best[np.argsort(-row[best], kind="stable")]
    top = [(int(t), float(row[t])) for t in best]
    if top[0][0] != token and row[token] == top[0][1]:  # exact tie: put the chosen one first
        top.sort(key=lambda p: (-p[1], p[0] != token))
    return TokenGap(token, top[0][0], top[1][0], top[0][1] - top[1][1], top)


def certify_greedy(
    reference: Sequence[TokenGap], candidate: Sequence[TokenGap], threshold: float = NEAR_TIE_GAP
) -> tuple[str, int | None]:
    """Compare two greedy runs of the same prompt, token by token (from their gap records).

    Returns ("identical", None); ("near_tie", i) when they first part at i and
    each run's logits put the other run's choice within ``threshold`` of their
    best (a rounding flip between tokens the model finds equally likely, not a
    bug); or ("diverged", i) otherwise.
    """
    for i, (r, c) in enumerate(zip(reference, candidate, strict=False)):
        if r.token == c.token:
            continue
        tie = r.shortfall(c.token) <= threshold and c.shortfall(r.token) <= threshold
        return ("near_tie" if tie else "diverged", i)
    if len(reference) != len(candidate):
        return "diverged", min(len(reference), len(candidate))
    return "identical", None


class _FairTurns:
    """A FIFO lock: waiters get the model in arrival order, one decode at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[threading.Event] = deque()
        self._busy = False

    def __enter__(self) -> None:
        with self._lock:
            if not self._busy and not self._queue:
                self._busy = True
                return
            ev = threading.Event()
            self._queue.append(ev)
        ev.wait()  # ownership is handed over directly by __exit__

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            if self._queue:
                self._queue.popleft().set()
            else:
                self._busy = False


@dataclass
class _Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # exactly what the KV cache holds
    last_used: float = 0.0
    busy: bool = False


class Verifier:
    """A target GGUF model with per-session KV slots and a speculative decoding loop."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_ctx: int = 8192,
        n_threads: int = 2,
        n_slots: int = 4,
        n_batch: int = 512,
        n_gpu_layers: int = 0,
        verbose: bool = False,
    ) -> None:
        """``n_ctx``: the context of each session (KV slot), capped at the model's trained
        length; ``n_slots`` sessions keep their KV cache at once."""
        import llama_cpp
        from llama_cpp import _internals

        self._llama_cpp = llama_cpp
        self.model_path = Path(model_path)
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        mparams.use_extra_bufts = extra_weight_buffers()
        self._model = _internals.LlamaModel(
            path_model=str(self.model_path), params=mparams, verbose=verbose
        )
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self._model.model))
        per_slot = max(64, min(int(n_ctx), self.n_ctx_train or int(n_ctx)))
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = per_slot * n_slots
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.n_seq_max = n_slots
        # A KV stream per slot: a session's decode attends over its own cells only (with
        # one unified pool, every decode walked every resident session's cells, masked).
        cparams.kv_unified = False
        # Sliding-window layers keep only their window (+ a batch): attention over
        # n_swa cells instead of the whole context. Rolling back a rejected draft is
        # safe: llama.cpp reuses a window cell only once it is outside the window of the
        # next position, which a rollback never moves back past. Reusing a cached prompt
        # from further back than the window is not, so _reusable_prefix checks it.
        cparams.swa_full = False
        self._ctx = _internals.LlamaContext(model=self._model, params=cparams, verbose=verbose)
        self._mem = self._ctx.memory
        self.n_ctx = int(llama_cpp.llama_n_ctx_seq(self._ctx.ctx))
        self.n_swa = int(llama_cpp.llama_model_n_swa(self._model.model))
        self.n_batch = n_batch
        self.n_threads = n_threads
        self._batch = _internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=verbose)
        self._vocab = llama_cpp.llama_model_get_vocab(self._model.model)
        self.vocab_size = int(self._model.n_vocab())
        self._turns = _FairTurns()
        self._slots_lock = threading.Condition()
        self._slots: dict[str, _Slot] = {}
        self._free_seq_ids = list(range(n_slots))
        self.n_slots = n_slots
        self._closed = False
        # Measured by measure_cost_profile: seconds per batch of k tokens as verified
        # (after padding), the raw measurement, and the padding plan.
        self.cost_seconds: dict[int, float] = {}
        self.raw_cost_seconds: dict[int, float] = {}
        self._pad_to: dict[int, int] = {}
        # What verification steps cost while serving, by tokens verified (draft + 1):
        # an exponential average of seconds and a sample count (see live_cost_profile).
        self._live_s: dict[int, float] = {}
        self._live_n: dict[int, int] = {}

    # ----------------------------------------------------------------- vocabulary

    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = False) -> list[int]:
        if not text:
            return [self.bos_token] if add_bos else []
        return list(self._model.tokenize(text.encode("utf-8"), add_bos, special))

    def token_bytes(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = self._llama_cpp.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = self._llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def detokenize_special(self, token: int) -> str:
        """A control token's text (``<bos>``), which plain detokenization omits."""
        buf = ctypes.create_string_buffer(128)
        n = self._llama_cpp.llama_token_to_piece(self._vocab, token, buf, 128, 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")

    @property
    def bos_token(self) -> int:
        return int(self._model.token_bos())

    @property
    def eos_token(self) -> int:
        return int(self._model.token_eos())

    def is_eog(self, token: int) -> bool:
        return bool(self._llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def metadata(self) -> dict[str, str]:
        return dict(self._model.metadata())

    # ---------------------------------------------------------------- low level

    def _decode(self, seq_id: int, tokens: Sequence[int], pos0: int, all_logits: bool) -> None:
        b = self._batch.batch
        n = len(tokens)
        b.n_tokens = n
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq_id
            b.logits[i] = all_logits
        b.logits[n - 1] = True
        rc = self._llama_cpp.llama_decode(self._ctx.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc}): KV cache full or bad batch")

    def _logits(self, i: int) -> np.ndarray:
        return self._logits_view(i).copy()

    def _logits_view(self, i: int) -> np.ndarray:
        """Row ``i`` of the last batch, in llama.cpp's buffer: valid until the next decode."""
        ptr = self._llama_cpp.llama_get_logits_ith(self._ctx.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.vocab_size,))

    @property
    def batch_padding(self) -> dict[int, int]:
        """Batch sizes that are padded up to a cheaper measured size (size -> padded)."""
        return dict(self._pad_to)

    def _padding(self, n: int, limit: int) -> int:
        """How many tokens to add to a batch of ``n`` to reach a cheaper measured shape."""
        target = self._pad_to.get(n, n)
        return target - n if n < target <= limit else 0

    def _seq_rm(self, seq_id: int, p0: int) -> None:
        if not self._llama_cpp.llama_memory_seq_rm(self._mem, seq_id, p0, -1):
            # A partial removal can fail (e.g. recurrent models): drop the whole sequence.
            self._llama_cpp.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
            raise RuntimeError("KV cache rollback failed")

    # ------------------------------------------------------------------- slots

    def _acquire_slot(self, key: str) -> _Slot:
        with self._slots_lock:
            while True:
                slot = self._slots.get(key)
                if slot is not None:
                    if not slot.busy:
                        slot.busy = True
                        return slot
                elif self._free_seq_ids:
                    slot = _Slot(seq_id=self._free_seq_ids.pop(0), busy=True)
                    self._slots[key] = slot
                    return slot
                else:
                    idle = [(s.last_used, k) for k, s in self._slots.items() if not s.busy]
                    if idle:
                        _, victim = min(idle)
                        old = self._slots.pop(victim)
                        self._llama_cpp.llama_memory_seq_rm(self._mem, old.seq_id, -1, -1)
                        slot = _Slot(seq_id=old.seq_id, busy=True)
                        self._slots[key] = slot
                        return slot
                self._slots_lock.wait()

    def _release_slot(self, slot: _Slot) -> None:
        with self._slots_lock:
            slot.busy = False
            slot.last_used = time.monotonic()
            self._slots_lock.notify_all()

    def _make_room(self, slot: _Slot, needed: int) -> None:
        """Refuse what cannot fit the slot's context (each slot has its own KV stream of
        ``n_ctx`` cells, so sessions never evict each other's tokens to make room)."""
        if len(slot.tokens) + needed > self.n_ctx:
            raise ContextOverflowError(
                f"context window of {self.n_ctx} tokens per session exceeded "
                f"({len(slot.tokens) + needed} needed)"
            )

    def _reusable_prefix(self, slot: _Slot, common: int) -> int:
        """How much of the slot's first ``common`` tokens can be kept after dropping the
        rest: all of them, unless the sliding-window cache has already reused cells that
        the next position needs (a prompt parting more than a window before the slot's
        end); then none, and the prompt is evaluated again."""
        if common and self.n_swa and slot.tokens:
            # The window cache's oldest position, before dropping anything (it is -1 once
            # the rollback empties the window cache).
            oldest = int(self._llama_cpp.llama_memory_seq_pos_min(self._mem, slot.seq_id))
            if oldest > max(0, common - self.n_swa):
                self._llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
                slot.tokens = []
                return 0
        if common < len(slot.tokens):
            self._seq_rm(slot.seq_id, common)
            del slot.tokens[common:]
        return common

    def forget(self, session_key: str) -> None:
        """Drop a session's KV cache (e.g. when the session is closed)."""
        with self._slots_lock:
            slot = self._slots.get(session_key)
            if slot is None or slot.busy:
                return
            del self._slots[session_key]
            self._llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
            self._free_seq_ids.append(slot.seq_id)
            self._slots_lock.notify_all()

    def cached_tokens(self, session_key: str) -> list[int]:
        with self._slots_lock:
            slot = self._slots.get(session_key)
            return list(slot.tokens) if slot else []

    # -------------------------------------------------------------- generation

    def generate(
        self,
        session_key: str,
        prompt_tokens: Sequence[int],
        params: GenerateParams | None = None,
        propose: Proposer | None = None,
        on_step: StepCallback | None = None,
    ) -> Iterator[Chunk]:
        """Stream the continuation of ``prompt_tokens``; the last chunk has a finish reason.

        ``propose(context, k)`` returns a draft (an object with ``path()`` and
        ``source``, or a plain token list) of at most ``k`` tokens continuing
        ``context`` (prompt + generated so far). ``on_step(draft, accepted, new)``
        is called after each step that asked for a draft (even an empty one), with
        ``new`` the accepted tokens and the verifier's own next token, e.g.
        ``drafter.observe``.
        """
        params = params or GenerateParams()
        params.validate()
        prompt = [int(t) for t in prompt_tokens]
        if not prompt:
            raise ValueError("empty prompt")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} outside the vocabulary (0..{self.vocab_size - 1})")
        if self._closed:
            raise RuntimeError("verifier is closed")
        slot = self._acquire_slot(session_key)
        try:
            yield from self._generate(slot, prompt, params, propose, on_step)
        finally:
            self._release_slot(slot)

    def _generate(
        self,
        slot: _Slot,
        prompt: list[int],
        params: GenerateParams,
        propose: Proposer | None,
        on_step: StepCallback | None,
    ) -> Iterator[Chunk]:
        stats = GenerationStats(prompt_tokens=len(prompt))
        t_start = time.perf_counter()
        greedy = params.temperature == 0.0
        rng = np.random.default_rng(params.seed)

        def dist(row: np.ndarray) -> np.ndarray:
            return target_probs(row, params.temperature, params.top_k, params.top_p)

        # --- prompt: reuse the longest common prefix the slot already holds. The last
        # prompt token stays out of the cache: the first decoding step evaluates it
        # together with a draft.
        common = 0
        limit = min(len(slot.tokens), len(prompt) - 1)
        while common < limit and slot.tokens[common] == prompt[common]:
            common += 1
        common = self._reusable_prefix(slot, common)
        stats.cached_prompt_tokens = common
        # The prompt must fit; the generation stops ("length") where the context ends.
        self._make_room(slot, len(prompt) - common + 1)
        max_tokens = max(1, min(params.max_tokens, self.n_ctx - len(prompt)))
        todo = prompt[common:-1]
        for i in range(0, len(todo), self.n_batch):
            part = todo[i : i + self.n_batch]
            with self._turns:
                self._decode(slot.seq_id, part, len(slot.tokens), all_logits=False)
            slot.tokens.extend(part)
        stats.prompt_s = time.perf_counter() - t_start

        context = list(prompt)
        pending = prompt[-1]
        generated = 0
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        text = ""
        emitted = 0
        max_stop = max((len(s) for s in params.stop), default=0)
        t_first: float | None = None
        record_before_first = 0.0
        finish: str | None = None

        while finish is None:
            remaining = max_tokens - generated
            room = self.n_ctx - len(slot.tokens) - 1
            k = max(0, min(params.max_draft, remaining - 1, room, self.n_batch - 1))
            draft_obj = propose(context, k) if (propose is not None and k > 0) else None
            path, source = _draft_path(draft_obj)
            path = path[:k]
            if any(not 0 <= t < self.vocab_size for t in path):
                raise ValueError("drafter proposed a token outside the vocabulary")
            if not path:
                source = "none"
            batch = [pending, *path]
            # Pad to a cheaper batch shape (llama.cpp's kernels like multiples of 4):
            # the padding is evaluated but never accepted, so the output is unchanged.
            batch += [batch[-1]] * self._padding(len(batch), min(room + 1, self.n_batch))
            n_past = len(slot.tokens)
            gaps: list[TokenGap] = []
            with self._turns:
                t_step = time.perf_counter()
                self._decode(slot.seq_id, batch, n_past, all_logits=True)
                self._observe_cost(len(path) + 1, time.perf_counter() - t_step)
                # Rows are read in place and only up to the first rejection: copying
                # 262k logits per drafted position costs more than the argmax.
                rows = _LogitRows(self, len(path) + 1)
                if greedy:
                    accepted = 0
                    nxt = int(np.argmax(rows[0]))
                    while accepted < len(path) and path[accepted] == nxt:
                        accepted += 1
                        nxt = int(np.argmax(rows[accepted]))
                    if params.record_gaps:
                        t_rec = time.perf_counter()
                        shape = tuple(batch)
                        for i in range(accepted + 1):
                            g = _token_gap(rows[i], path[i] if i < accepted else nxt)
                            g.pos0, g.batch, g.row = n_past, shape, i
                            gaps.append(g)
                        stats.record_s += time.perf_counter() - t_rec
                else:
                    accepted, nxt = speculative_sample(rows, path, rng, dist)
            # Keep the evaluated pending token and the accepted draft; drop the rest.
            keep = n_past + 1 + accepted
            if keep < n_past + len(batch):
                self._seq_rm(slot.seq_id, keep)
            slot.tokens.append(pending)
            slot.tokens.extend(path[:accepted])
            new = [*path[:accepted], nxt]
            pending = nxt
            stats.steps += 1
            stats.drafted_tokens += len(path)
            stats.accepted_tokens += accepted
            if path:
                agg = stats.by_source.setdefault(source, [0, 0])
                agg[0] += len(path)
                agg[1] += accepted
            # Every step the drafter was asked about, empty drafts included: a step
            # without a draft is one token at the cost of one, and the drafter's
            # achieved rate (what each draft must beat) has to count it.
            if on_step is not None and draft_obj is not None:
                on_step(draft_obj, accepted, new)

            # --- finish conditions, token by token
            out: list[int] = []
            eog = False
            for tok in new:
                if not params.ignore_eos and self.is_eog(tok):
                    finish = "stop"
                    eog = True
                    break
                out.append(tok)
                generated += 1
                text += decoder.decode(self.token_bytes(tok))
                if params.stop:
                    start = max(0, emitted - max_stop)
                    hits = [i for s in params.stop if (i := text.find(s, start)) >= 0]
                    if hits:
                        text = text[: min(hits)]
                        finish = "stop"
                        break
                if generated >= max_tokens:
                    finish = "length"
                    break
            context.extend(new)
            if t_first is None:
                t_first = time.perf_counter()
                stats.first_token_s = t_first - t_start - stats.record_s
                record_before_first = stats.record_s
            if finish is None and params.stop:
                # Hold back a tail that could still become a stop string.
                hold = 0
                for s in params.stop:
                    for j in range(min(len(s) - 1, len(text) - emitted), 0, -1):
                        if text.endswith(s[:j]):
                            hold = max(hold, j)
                            break
                upto = len(text) - hold
            else:
                if finish is not None and not (params.stop and finish == "stop" and not eog):
                    text += decoder.decode(b"", final=True)
                upto = len(text)
            piece = text[emitted:upto] if upto > emitted else ""
            emitted = max(emitted, upto)
            chunk = Chunk(
                text=piece,
                tokens=out,
                source=source,
                proposed=len(path),
                accepted=accepted,
                # the end-of-generation token is not output, but its gap is kept so
                # that a run stopping where another goes on can be certified too
                gaps=gaps[: len(out) + int(eog)],
            )
            if finish is not None:
                now = time.perf_counter()
                stats.completion_tokens = generated
                stats.decode_s = now - (t_first or now) - (stats.record_s - record_before_first)
                stats.total_s = now - t_start - stats.record_s
                chunk.finish_reason = finish
                chunk.stats = stats
            yield chunk

    # ------------------------------------------------------------ measurement

    def measure_cost_profile(
        self, ks: Sequence[int] = tuple(range(1, 34)), reps: int = 5
    ) -> dict[int, float]:
        """Time one verification batch of k tokens (all logits) relative to k = 1.

        Runs on a scratch slot at a realistic context length, sizes interleaved so
        that a burst of machine load does not hit one size only; each size keeps its
        fastest repetition. llama.cpp's CPU kernels work in blocks of rows, so some
        batch sizes cost less than smaller ones (here 8 tokens cost less than 5); a
        batch is then padded up to the cheaper size, and the returned profile is the
        cost after padding. It feeds ``suffixcache.CostProfile`` so drafts stay within
        what pays.
        """
        key = "\x00cost-profile"
        ks = sorted({int(k) for k in ks if 1 <= int(k) <= self.n_batch})
        slot = self._acquire_slot(key)
        try:
            # a realistic context: 512 tokens, or what a small context leaves room for
            n_base = max(1, min(512, self.n_ctx - max(ks) - 1))
            base = [self.bos_token] + [(7 * i + 100) % self.vocab_size for i in range(n_base - 1)]
            self._make_room(slot, len(base) + max(ks))
            with self._turns:
                self._seq_rm(slot.seq_id, 0)
                slot.tokens = []
                self._decode(slot.seq_id, base, 0, all_logits=False)
                slot.tokens = list(base)
            samples: dict[int, list[float]] = {k: [] for k in ks}
            rounds = 0
            # One token is the cheapest batch there is. Under heavy load (more busy
            # threads than cores) llama.cpp's threads wait for each other at every op,
            # which inflates small batches most: one such measurement had one token
            # dearer than eight. So while the fastest one-token time is not below every
            # other size's, measure more rounds (up to a cap).
            while rounds < reps or (rounds < MAX_PROFILE_ROUNDS and not _plausible(samples)):
                rounds += 1
                for k in ks:
                    with self._turns:
                        t0 = time.perf_counter()
                        self._decode(slot.seq_id, base[1 : k + 1], len(base), all_logits=True)
                        self._logits_view(k - 1)
                        samples[k].append(time.perf_counter() - t0)
                        self._seq_rm(slot.seq_id, len(base))
        finally:
            self._release_slot(slot)
            self.forget(key)
        # The fastest of the repetitions: other processes on the machine only ever add
        # time, and a profile inflated by a burst of load makes the drafter too timid.
        raw = {k: float(np.min(v)) for k, v in samples.items()}
        if not _plausible(samples):
            log.warning(
                "verifier cost profile measured under heavy load (%d rounds, one token "
                "not the cheapest batch); larger batches are taken to cost at least one token",
                rounds,
            )
            floor = raw.get(1, min(raw.values()))
            raw = {k: max(t, floor) for k, t in raw.items()}
        self.raw_cost_seconds = {**self.raw_cost_seconds, **raw}
        self._pad_to, self.cost_seconds = plan_batch_shapes(self.raw_cost_seconds)
        one = self.cost_seconds[min(self.cost_seconds)]
        return {k: round(self.cost_seconds[k] / one, 3) for k in ks}

    def _observe_cost(self, n: int, seconds: float) -> None:
        old = self._live_s.get(n)
        self._live_s[n] = seconds if old is None else old + LIVE_COST_ALPHA * (seconds - old)
        self._live_n[n] = self._live_n.get(n, 0) + 1

    def live_cost_profile(self, min_samples: int = 16) -> dict[int, float] | None:
        """The cost profile as serving measures it (relative to one token), for the sizes
        verified at least ``min_samples`` times, the start-up measurement elsewhere; None
        until plain steps (one token) have been seen that often.

        The start-up profile is one moment of this machine: other processes, another
        session's long prompt or a thermal limit change what a batch costs relative to
        one token (under load, llama.cpp's threads wait for each other at every op, which
        makes small batches dearer), and a drafter planning with a stale profile drafts
        too much or too little."""
        if self._live_n.get(1, 0) < min_samples or not self.cost_seconds:
            return None
        one = self._live_s[1]
        measured = self.cost_seconds[min(self.cost_seconds)]
        start = {k: v / measured for k, v in self.cost_seconds.items()}
        live = {k: self._live_s[k] / one for k, n in self._live_n.items()
                if n >= min_samples and k > 1}
        # Sizes serving has not seen keep the start-up shape, moved by how much the
        # sizes it has seen moved (so the profile stays one consistent curve).
        moved = [live[k] / start[k] for k in live if k in start]
        factor = float(np.exp(np.mean(np.log(moved)))) if moved else 1.0
        out = {k: v * factor for k, v in start.items()}
        out.update(live)
        out[1] = 1.0
        return {k: round(max(v, 1.0), 3) for k, v in sorted(out.items())}

    def _rows(
        self, seq_id: int, tokens: Sequence[int], pos0: int, batch_size: int
    ) -> list[np.ndarray]:
        rows: list[np.ndarray] = []
        for j in range(0, len(tokens), batch_size):
            part = tokens[j : j + batch_size]
            with self._turns:
                self._decode(seq_id, part, pos0 + j, all_logits=True)
                rows.extend(self._logits(i) for i in range(len(part)))
        return rows

    def next_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """The target's logits after ``tokens`` (a scratch slot; nothing is cached)."""
        return self.logit_rows(tokens, len(tokens) - 1, 1)[-1]

    @contextlib.contextmanager
    def _scratch(self, prefix: Sequence[int], chunk: int, room: int) -> Iterator[int]:
        """A fresh scratch slot holding ``prefix``, evaluated ``chunk`` tokens at a time
        without logits, with ``room`` more cells; yields its sequence id, then forgets it."""
        key = "\x00scratch"
        slot = self._acquire_slot(key)
        try:
            self._make_room(slot, len(prefix) + room)
            self._llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
            slot.tokens = []
            step = min(chunk, self.n_batch)
            for j in range(0, len(prefix), step):
                with self._turns:
                    self._decode(slot.seq_id, prefix[j : j + step], j, all_logits=False)
            yield slot.seq_id
        finally:
            self._release_slot(slot)
            self.forget(key)

    def logit_rows(self, tokens: Sequence[int], n_prefix: int, batch_size: int) -> list[np.ndarray]:
        """Logits after each of ``tokens[n_prefix:]``, evaluated ``batch_size`` at a time."""
        tokens = list(tokens)
        with self._scratch(tokens[:n_prefix], self.n_batch, len(tokens) - n_prefix) as seq_id:
            return self._rows(seq_id, tokens[n_prefix:], n_prefix, batch_size)

    def reproduces(self, context: Sequence[int], gap: TokenGap) -> bool:
        """Whether a fresh evaluation of ``context`` with the batch shape ``gap`` was
        computed in (same first position, same batch tokens, same row; everything
        before it in n_batch chunks on a scratch slot) picks ``gap.token`` again.

        Certifies a greedy divergence as llama.cpp's batch-shape arithmetic rather
        than state of the generation loop (a stale or misplaced KV cell, a wrong
        position): the same tokens with the same shape give the same choice.
        """
        return self.fresh_choice(context, gap, self.n_batch) == gap.token

    def fresh_choice(self, context: Sequence[int], gap: TokenGap, chunk: int) -> int:
        """The token a fresh evaluation picks at ``gap``'s position: ``context`` before
        the recorded batch evaluated in chunks of ``chunk`` tokens on a scratch slot, then
        the recorded batch itself. Different chunkings of the same tokens compute the KV
        cache with different batch shapes, which moves later logits on this CPU."""
        return self.replayed_choice(context, (), gap, chunk)

    def replayed_choice(
        self, context: Sequence[int], steps: Sequence[TokenGap], gap: TokenGap, chunk: int
    ) -> int:
        """The token picked at ``gap``'s position when a fresh slot is built the way the
        run built it: ``context`` up to the run's first recorded batch in chunks of
        ``chunk`` tokens, then every batch the run evaluated before ``gap``'s (``steps``:
        its gap records, one or more per batch, in order), each rolled back to what the
        run kept, then ``gap``'s own batch. Without ``steps``, a fresh evaluation."""
        if gap.pos0 < 0 or not gap.batch or not 0 <= gap.row < len(gap.batch):
            raise ValueError("this gap record has no batch shape (record_gaps=True runs do)")
        if chunk < 1:
            raise ValueError("chunk must be >= 1")
        ctx = list(context)
        if ctx[gap.pos0 :] != list(gap.batch[: gap.row + 1]):
            raise ValueError("context does not end with the recorded batch")
        batches: list[tuple[int, tuple[int, ...]]] = []
        for g in steps:
            if g.pos0 < 0 or not g.batch:
                raise ValueError("a step record has no batch shape")
            if g.pos0 >= gap.pos0:
                break
            if not batches or batches[-1][0] != g.pos0:
                batches.append((g.pos0, g.batch))
        start = batches[0][0] if batches else gap.pos0
        room = max(p + len(b) for p, b in [*batches, (gap.pos0, gap.batch)]) - start
        with self._scratch(ctx[:start], chunk, room) as seq_id:
            # each batch keeps what the run kept: the positions before the next batch
            ends = [p for p, _ in batches[1:]] + [gap.pos0] * bool(batches)
            for (pos0, batch), keep in zip(batches, ends, strict=True):
                with self._turns:
                    self._decode(seq_id, batch, pos0, all_logits=True)
                    self._seq_rm(seq_id, keep)
            with self._turns:
                self._decode(seq_id, gap.batch, gap.pos0, all_logits=True)
                return int(np.argmax(self._logits_view(gap.row)))

    def schedule_flip(
        self,
        context: Sequence[int],
        a: TokenGap,
        b: TokenGap,
        chunks: Sequence[int] = (512, 256, 128, 64, 32),
    ) -> bool:
        """Whether both runs' choices at a parting are choices of llama.cpp itself for
        these exact tokens: fresh evaluations of the common ``context``, with each run's
        batch shape and the context chunked in several ways, pick ``a.token`` under
        some batch schedule and ``b.token`` under another. Then the parting is
        the arithmetic of batch schedules (which the generation loop only chooses), not
        a token the model would never produce for this context."""
        seen: set[int] = set()
        for chunk in chunks:
            for g in (a, b):
                seen.add(self.fresh_choice(context, g, chunk))
                if a.token in seen and b.token in seen:
                    return True
        return False

    def logit_drift(
        self, tokens: Sequence[int], n_prefix: int, batch_size: int
    ) -> tuple[float, float]:
        """How much batch shape moves the logits: evaluate ``tokens[n_prefix:]`` one at a
        time and ``batch_size`` at a time; return (max |logit change|, max change of the
        gap between the 1-token evaluation's top two tokens)."""
        single = self.logit_rows(tokens, n_prefix, 1)
        batched = self.logit_rows(tokens, n_prefix, batch_size)
        d = g = 0.0
        for a, b in zip(single, batched, strict=True):
            d = max(d, float(np.max(np.abs(a - b))))
            t1 = int(np.argmax(a))
            a2 = a.copy()
            a2[t1] = -np.inf
            t2 = int(np.argmax(a2))
            g = max(g, abs(float((a[t1] - a[t2]) - (b[t1] - b[t2]))))
        return d, g

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._batch.close()
        self._ctx.close()
        self._model.close()
