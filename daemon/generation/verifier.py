"""The colocated verifier: speculative decoding over llama-cpp-python's low-level API.

One step of generation evaluates, in a single ``llama_decode`` batch, the last
accepted token (not yet in the KV cache) followed by the whole draft, with
logits for every position. The target accepts the longest draft prefix it
agrees with and adds its own next token (the "bonus" token); the rejected tail
is removed from the KV cache with ``llama_memory_seq_rm``.

Losslessness:

* temperature 0: the accepted prefix is exactly what greedy decoding of the
  same logits picks, so the output equals plain decoding, up to llama.cpp's
  batch-shape dependent rounding (see ``certify.NEAR_TIE_GAP``).
* temperature > 0: speculative sampling with a point-mass proposal
  (``sampling.speculative_sample``), so every emitted token has exactly the
  target distribution.

Sessions keep their KV cache between turns: each session owns one sequence id
of the context ("slot", ``kv_slots``) and a new prompt only pays for the tokens
after its longest common prefix with what the slot already holds. Several sessions
share the model through a FIFO turn queue taken once per ``llama_decode`` so a
long generation cannot starve the others.

``Verifier`` holds the model handle, the vocabulary, the low-level decode and the
step loop (``generate``); its mixins hold the rest: ``kv_slots.KvSlots`` (slots and
their KV), ``cost_measure.CostMeasurement`` (what a batch costs, padding) and
``certify.Certification`` (fresh evaluations that certify greedy runs).

The verifier knows nothing about suffix trees: it takes a ``propose(context,
k)`` callable, so it runs as well with the suffixcache Drafter, a draft model,
prompt lookup or a scripted drafter in tests.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from suffixcache import common_prefix_length

from ..model import (
    extra_weight_buffers,
    flash_attention_wanted,
    use_batch_invariant_kernels,
)
from ..model.llama_log import route_llama_logs
from .certify import Certification
from .compute_thread import compute
from .cost_measure import CostMeasurement, MeasurementStopped
from .generation_run import Chunk as Chunk  # the callers' names, from here as before
from .generation_run import DraftLike as DraftLike
from .generation_run import GenerateParams as GenerateParams
from .generation_run import GenerationStats as GenerationStats
from .generation_run import (
    LogitRows,
    Proposer,
    Run,
    Step,
    StepCallback,
    cut_draft,
    draft_path,
    gap_records,
    grammar_states,
    verdict,
)
from .grammar import GrammarError
from .kv_slots import ContextOverflowError as ContextOverflowError  # raised by generate
from .kv_slots import KvSlots, Slot
from .step_batch import Interrupted, StepBatcher
from .step_planner import StepRows

log = logging.getLogger("suffixd.verifier")

# A checkpoint less than this past a continuing conversation's cached prompt does not
# split its prompt while other generations step (see _checkpoint_points).
CHECKPOINT_SPLIT_MIN = 64
# The longest a prompt waits for another prefill's announced checkpoint (which is settled
# when that prefill passes it or ends; this only bounds a stalled one).
CHECKPOINT_WAIT_S = 600.0


class GreedyDraft(NamedTuple):
    """``Verifier.greedy_draft``'s tokens, and the context tokens its slot held already
    (``reused``) and those it evaluated first (``evaluated``)."""

    tokens: list[int]
    reused: int
    evaluated: int
    evaluate_s: float = 0.0  # evaluating them, before the first drafted token

class Verifier(KvSlots, CostMeasurement, Certification):
    """A target GGUF model with per-session KV slots and a speculative decoding loop."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        n_ctx: int = 8192,
        n_threads: int = 2,
        n_slots: int = 4,
        n_batch: int = 512,
        n_ubatch: int | None = None,
        n_gpu_layers: int = 0,
        prompt_cache_mb: int = 1024,
        verbose: bool = False,
        deterministic: bool = False,
    ) -> None:
        """``n_ctx``: the context of each session (KV slot), capped at the model's trained
        length; ``n_slots`` sessions keep their KV cache at once; ``prompt_cache_mb``:
        host memory for prompt checkpoints shared across sessions (0: none);
        ``deterministic``: a row's logits depend only on its sequence's tokens and its
        position, not on the batch it is evaluated in (``determinism``)."""
        import llama_cpp
        from llama_cpp import _internals

        self._llama_cpp = llama_cpp
        self.model_path = Path(model_path)
        route_llama_logs()
        if deterministic:
            # before llama.cpp's first matrix product in this process: ggml reads it once
            use_batch_invariant_kernels()
        llama_cpp.llama_backend_init()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        # Repacked weights multiply 4 rows at a time and the rest one by one (a row's
        # logits then depend on its index in the batch): off in deterministic mode.
        self.extra_buffers = extra_weight_buffers() and not deterministic
        mparams.use_extra_bufts = self.extra_buffers
        # loaded on the compute thread: a load may open an OpenMP region (compute_thread)
        self._model = compute.call(lambda: _internals.LlamaModel(
            path_model=str(self.model_path), params=mparams, verbose=verbose
        ))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self._model.model))
        per_slot = max(64, min(int(n_ctx), self.n_ctx_train or int(n_ctx)))
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = per_slot * n_slots
        cparams.n_batch = n_batch
        # ubatch rows: llama.cpp also sizes each sliding-window layer's KV ring n_swa +
        # n_ubatch, and attention without flash attention runs over the whole ring
        cparams.n_ubatch = n_ubatch = min(n_batch, n_ubatch or n_batch)
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.n_seq_max = n_slots
        # A KV stream per slot: a session's decode attends over its own cells only (with
        # one unified pool, every decode walked every resident session's cells, masked).
        cparams.kv_unified = False
        # Sliding-window layers keep only their window (+ a batch): attention over
        # n_swa cells instead of the whole context. Rolling back a rejected draft is
        # safe while the draft sits in one ubatch (the plan keeps every decode in one:
        # step_planner._keep_decodes_whole): llama.cpp reuses a window cell only once it is
        # outside the window of the next position. Reusing a cached prompt
        # from further back than the window is not, so _reusable_prefix checks it.
        # Deterministic mode keeps the whole context instead (llama.cpp's swa_full): once
        # a sequence passes the ring's end (n_swa + n_ubatch cells) a rolled-back draft
        # that had wrapped to the ring's start moves llama.cpp's search head there, so the
        # next positions land in other cells than plain decoding's, and attention sums
        # over cells in cell order: logits up to ~0.4 apart (bench/swa_ring_probe.py:
        # 3 of 24 drafted spider_dev turns with the ring, 0 of 24 without). The cost:
        # every layer's KV for the whole context, as the full-attention ones, and
        # attention over all of it (a decoded token 1.86x dearer at 8k tokens, BENCHMARKS).
        cparams.swa_full = deterministic
        # Flash attention only when asked (SUFFIXD_FLASH_ATTN=on: it pays in some regimes
        # only, model.flash_attention_wanted) and where llama.cpp sums it in F32 (our
        # patched build): stock 0.3.36 sums batches of under 64 rows in F16, which can
        # leave a wrong K/V row in the cache (a 32-token batch ending at position 4194 of
        # a spider_dev session made a later step's logits 20.7 where every other batching
        # of the same tokens gives 12.4), so a drafted turn parted from plain decoding
        # (tests/test_verifier_batch_invariance.py). Not in deterministic mode (its tiled
        # path for 64 rows and more sums in another order than the one under 64), nor with
        # layers on a GPU (another kernel, not checked here).
        self.flash_attention = (flash_attention_wanted() and not deterministic
                                and n_gpu_layers == 0)
        cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
                                   if self.flash_attention
                                   else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        self._ctx = compute.call(lambda: _internals.LlamaContext(
            model=self._model, params=cparams, verbose=verbose))
        self._mem = self._ctx.memory
        # deterministic: a cell kept free at the end of every slot, for the padding row of
        # a last position's decode (no decode runs one row of a sequence)
        self.n_ctx = int(llama_cpp.llama_n_ctx_seq(self._ctx.ctx)) - int(deterministic)
        self.n_swa = int(llama_cpp.llama_model_n_swa(self._model.model))
        if deterministic and self.n_swa:
            self.restore_limit = self.n_swa  # see KvSlots.restore_limit
        self.n_batch = n_batch
        self.n_ubatch = n_ubatch
        self.n_threads = n_threads
        self._batch = _internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=verbose)
        self._vocab = llama_cpp.llama_model_get_vocab(self._model.model)
        self.vocab_size = int(self._model.n_vocab())
        self._init_slots(n_slots, prompt_cache_mb << 20)
        self._closed = False
        self._init_costs()
        self._measure_stop = threading.Event()
        self._cost_model: tuple[object, Callable[[int], float]] | None = None
        # Rollbacks of different sequences run in the threads of their generations,
        # between two decodes: llama.cpp's memory calls are not made for concurrency.
        self._mem_lock = threading.Lock()
        # Shared steps choose every sequence's draft length together (step_planner); off:
        # each draft stays as its drafter cut it for a step of its own.
        self.joint_drafts = True
        # (through lambdas: a test may replace the bound methods)
        self._steps = StepBatcher(lambda b: self._run_step(b), n_batch,
                                  lambda n: self._relative_cost(n),
                                  lambda n, limit: self._padding(n, limit), n_ubatch,
                                  lambda n, rows: self._logit_rows(n, rows))
        self._steps.no_single_rows = deterministic
        self.determinism: dict[str, Any] = {"on": False, "requested": deterministic}
        if deterministic:
            self._check_determinism()

    @property
    def deterministic(self) -> bool:
        """Whether a row's logits depend only on its sequence's tokens and position: the
        mode was asked for and its start-up check found it holds."""
        return bool(self.determinism["on"])

    def _check_determinism(self) -> None:
        """Deterministic mode's start-up check, on slot 0 before any session has it:
        positions 3-11 of a made-up sequence evaluated as one 9-row batch (where the kernels
        chosen by row count would differ: ggml's tiled K-quant product from 8 rows, the
        repacked weights' 4-row blocks) and as batches of 1 (padded), 2, 3 and 3 rows must
        give the same logits, bit for bit. They do not when llama.cpp ran a matrix
        product in this process before GGML_CPU_TILED_MM and SUFFIXD_GGML_ROWS were set
        (ggml reads them once: model.use_batch_invariant_kernels), or
        on a build whose kernels this mode does not know; the mode is then off and
        ``determinism["why"]`` says so."""
        t0 = time.perf_counter()
        toks = [self.bos_token, *[(977 + 131 * i) % self.vocab_size for i in range(11)]]

        def rows(shape: Sequence[int]) -> list[np.ndarray]:
            self._seq_rm(0, 3)
            out, pos = [], 3
            for n in shape:
                self._decode(0, toks[pos:pos + n], pos, all_logits=True)
                out += [self._logits(i) for i in range(n)]
                pos += n
            return out

        with self._turns:
            self._llama_cpp.llama_memory_seq_rm(self._mem, 0, -1, -1)
            self._decode(0, toks[:3], 0, all_logits=False)
            whole = rows([9])
            parts = rows([1, 2, 3, 3])
            self._llama_cpp.llama_memory_seq_rm(self._mem, 0, -1, -1)
        same = all(np.array_equal(a, b) for a, b in zip(whole, parts, strict=True))
        self.determinism["check_s"] = round(time.perf_counter() - t0, 3)
        self.determinism["on"] = same
        if not same:
            worst = max(float(np.abs(a - b).max()) for a, b in zip(whole, parts, strict=True))
            tiled = os.environ.get("GGML_CPU_TILED_MM")
            few_rows = os.environ.get("SUFFIXD_GGML_ROWS")
            self.determinism["why"] = (
                f"start-up check failed: a 9-row batch and batches of 1-3 rows gave logits "
                f"up to {worst:.3g} apart (GGML_CPU_TILED_MM={tiled}, SUFFIXD_GGML_ROWS="
                f"{few_rows}; llama.cpp may have run a matrix product in this process before "
                "they were set)")
            log.warning("deterministic mode is off: %s", self.determinism["why"])

    @property
    def _turns(self) -> AbstractContextManager[None]:
        """The model alone between two steps (cost measurement, certification, KV
        changes outside a generation's own step)."""
        return self._steps.exclusive()

    def _memory_guard(self) -> AbstractContextManager[None]:
        return self._steps.exclusive()

    @contextmanager
    def _measure_turn(self) -> Iterator[None]:
        """One batch of the cost measurement: the model alone once no generation is
        active or waiting (it never delays a request by more than that batch), or
        MeasurementStopped once ``stop_measuring`` is set."""
        try:
            with self._steps.quiet_exclusive(self._measure_stop):
                if self._closed:
                    raise MeasurementStopped
                yield
        except Interrupted:
            raise MeasurementStopped from None

    def stop_measuring(self) -> None:
        """End a cost measurement in progress at its next batch (MeasurementStopped)."""
        self._measure_stop.set()

    def stop_generating(self) -> None:
        """The daemon stops: every generation ends at its next step with ``Stopping``
        (a step already queued still runs)."""
        self._steps.stop()

    def batch_stats(self) -> dict[str, Any]:
        """How the steps were shared: steps, sequences and rows per step, requests'
        queueing before their first step, and the cost measurement's progress and the
        load it ran under."""
        return {**self._steps.counters.as_dict(), "rate": round(self._steps.rate, 3),
                "deterministic": self.deterministic,
                "step_cost": self._steps.model.as_dict(),
                "measurement": {"batches": self.measured_batches, **self.cost_load}}

    @property
    def step_model(self) -> bool:
        """Whether shared steps are planned with the fitted step cost model."""
        return self._steps.use_model

    @step_model.setter
    def step_model(self, on: bool) -> None:
        self._steps.use_model = on

    def _on_new_costs(self, one_row_seconds: float) -> None:
        """A measured or loaded profile: the shared-step model starts from its scale."""
        self._steps.model.rescale(one_row_seconds)

    def _relative_cost(self, n: int) -> float:
        """A step of ``n`` verified rows relative to one, from the measured profile
        (before it is measured: a CPU-like 0.25 per extra row)."""
        src = self.cost_seconds
        if self._cost_model is None or self._cost_model[0] is not src:
            if src:
                from suffixcache import CostProfile

                prof = CostProfile.from_mapping(src)
                self._cost_model = (src, prof.cost)
            else:
                self._cost_model = (src, lambda k: 1.0 + 0.25 * (k - 1) if k > 0 else 0.0)
        return self._cost_model[1](n)

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

    def tokenize_bytes(self, data: bytes, special: bool = True) -> list[int]:
        """``data`` tokenized, with special tokens parsed unless not ``special``, no BOS
        added."""
        return list(self._model.tokenize(data, False, special)) if data else []

    def special_tokens(self) -> list[tuple[int, bytes, str]]:
        """(id, text, kind) of every token llama.cpp's special-token partition matches in
        a text: kind "control" and "unknown" only when asked to parse special tokens,
        "user" (user-defined) either way; "control-lstrip" for a control token that
        takes the whitespace before it, "control-rstrip" for one that takes only the
        whitespace after it."""
        llama_cpp = self._llama_cpp
        out = []
        for i in range(self.vocab_size):
            attr = llama_cpp.llama_vocab_get_attr(self._vocab, i)
            if attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL:
                kind = ("control-lstrip" if attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP else
                        "control-rstrip" if attr & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP else
                        "control")
            elif attr & llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN:
                kind = "unknown"
            elif attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED:
                kind = "user"
            else:
                continue
            text = llama_cpp.llama_vocab_get_text(self._vocab, i)
            if text:
                out.append((i, bytes(text), kind))
        return out

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

    def _decode(self, seq_id: int, tokens: Sequence[int], pos0: int, all_logits: bool,
                outputs: int | None = None) -> None:
        """Evaluate ``tokens`` at ``pos0`` with logits for every row (``all_logits``) or the
        last one, or, given ``outputs``, for the first ``outputs`` rows only: llama.cpp runs
        the last layer past attention and the output layer (262k x 640 for gemma-3) only
        for rows with logits, so padding that asks for none costs little."""
        if outputs is None:
            outputs = len(tokens) if all_logits else 0
        self._decode_rows([(seq_id, tokens, pos0, outputs)])

    def _run_step(self, batch: list[StepRows]) -> None:
        """One decode of a planned step: each request's kept tokens then its padding (the
        last kept token again; logits only where the plan asks, ``StepRows.outputs``),
        at its own sequence and positions. A prompt chunk's padding (deterministic mode's
        plan pads a chunk that would be a ubatch's single row) is rolled back here; a
        decode's with its rejected draft."""
        if self._closed:  # freed: a decode now would touch freed memory
            raise RuntimeError("verifier is closed")
        rows = []
        for r in batch:
            toks = r.tokens[: r.kept]
            rows.append((r.seq_id, toks + [toks[-1]] * (r.rows - r.kept), r.pos0, r.outputs))
        self._decode_rows(rows)
        for r in batch:
            if r.prompt and r.rows > r.kept:
                with self._mem_lock:
                    self._seq_rm(r.seq_id, r.pos0 + r.kept)

    def _decode_rows(self, rows: Sequence[tuple[int, Sequence[int], int, int]]) -> None:
        """One ``llama_decode`` of (sequence, tokens, first position, rows with logits) each
        (the last row has logits when none asks for any). In deterministic mode a single
        sequence's decode that would leave llama.cpp a one-row ubatch gets a padding row
        (no logits, rolled back after; a step's plan sees to its own, ``plan_step``)."""
        pad = 0
        if self._steps.no_single_rows and len(rows) == 1 and \
                len(rows[0][1]) % self.n_ubatch == 1 and len(rows[0][1]) < self.n_batch:
            seq_id, tokens, pos0, outputs = rows[0]
            rows = [(seq_id, [*tokens, tokens[-1]], pos0, outputs)]
            pad = 1
        self._decode_batch(rows, pad)
        if pad:
            seq_id, tokens, pos0, _ = rows[0]
            with self._mem_lock:
                self._seq_rm(seq_id, pos0 + len(tokens) - pad)

    def _decode_batch(self, rows: Sequence[tuple[int, Sequence[int], int, int]],
                      pad: int) -> None:
        b = self._batch.batch
        n = 0
        for seq_id, tokens, pos0, outputs in rows:
            for i, t in enumerate(tokens):
                b.token[n] = t
                b.pos[n] = pos0 + i
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = seq_id
                b.logits[n] = i < outputs
                n += 1
        b.n_tokens = n
        if not any(outputs > 0 for *_, outputs in rows):
            b.logits[n - 1 - pad] = True
        ctx, decode = self._ctx.ctx, self._llama_cpp.llama_decode
        rc = compute.call(lambda: decode(ctx, b))  # every decode on one thread: compute_thread
        if rc != 0:
            raise RuntimeError(f"llama_decode failed ({rc}): KV cache full or bad batch")

    def _logits(self, i: int) -> np.ndarray:
        return self._logits_view(i).copy()

    def _logits_view(self, i: int) -> np.ndarray:
        """Row ``i`` of the last batch, in llama.cpp's buffer: valid until the next decode."""
        ptr = self._llama_cpp.llama_get_logits_ith(self._ctx.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.vocab_size,))

    # -------------------------------------------------------------- generation

    def _check_tokens(self, tokens: list[int]) -> None:
        """Refuse tokens outside the vocabulary, and any work once the verifier is closed."""
        bad = [t for t in tokens if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} outside the vocabulary (0..{self.vocab_size - 1})")
        if self._closed:
            raise RuntimeError("verifier is closed")

    @staticmethod
    def _held_prefix(slot: Slot, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the slot already holds, the last one never: it is
        evaluated again for the logits that follow it."""
        return common_prefix_length(slot.tokens, tokens[:-1])

    def greedy_draft(self, session_key: str, context: Sequence[int], k: int) -> GreedyDraft:
        """Up to ``k`` greedy tokens after ``context``, decoded one after another in the
        session's slot with the model held alone: a draft model's loop, as llama-server
        drafts. ``generate`` prices each draft a step of the shared batcher, a sampler
        pass and a chunk: a drafted token cost 36-43 ms in use where its decode took 15
        (F32 verifier, Q4_K_M draft, Zen 3). The slot keeps the context and the drafted
        tokens but the last, so the next draft evaluates only what was accepted since."""
        ctx = [int(t) for t in context]
        if not ctx or k < 1:
            return GreedyDraft([], 0, 0)
        self._check_tokens(ctx)
        slot = self._acquire_slot(session_key)
        try:
            with self._turns:
                common = self._keep_prefix(slot, self._held_prefix(slot, ctx))
                k = min(k, self.n_ctx - len(ctx))
                if k < 1:
                    return GreedyDraft([], common, 0)
                t0 = time.perf_counter()
                for pos in range(len(slot.tokens), len(ctx), self.n_batch):
                    part = ctx[pos:pos + self.n_batch]
                    self._decode(slot.seq_id, part, pos, all_logits=False)
                    slot.tokens.extend(part)
                evaluate_s = time.perf_counter() - t0
                out = [int(np.argmax(self._logits_view(-1)))]
                while len(out) < k:
                    self._decode(slot.seq_id, out[-1:], len(slot.tokens), all_logits=True)
                    slot.tokens.append(out[-1])
                    out.append(int(np.argmax(self._logits_view(-1))))
                return GreedyDraft(out, common, len(ctx) - common, evaluate_s)
        finally:
            self._release_slot(slot)

    def generate(
        self,
        session_key: str,
        prompt_tokens: Sequence[int],
        params: GenerateParams | None = None,
        propose: Proposer | None = None,
        on_step: StepCallback | None = None,
        cache_points: Sequence[int] = (),
        cache_scope: str = "",
    ) -> Iterator[Chunk]:
        """Stream the continuation of ``prompt_tokens``; the last chunk has a finish reason.

        ``cache_points``: prompt positions other prompts are likely to share (e.g. the end
        of a chat's system messages), where a checkpoint of the KV state is worth keeping
        (``prompt_cache``); ``cache_scope``: who may reuse it (the namespace).

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
        self._check_tokens(prompt)
        # from its arrival: the cost measurement waits while it waits for a slot, and its
        # queueing before the first step is counted
        with self._steps.request() as request:
            slot = self._acquire_slot(session_key)
            try:
                self._steps.join()
                try:
                    yield from self._generate(slot, prompt, params, propose, on_step,
                                              cache_points, cache_scope, request)
                finally:
                    self._steps.leave()
            finally:
                self._release_slot(slot)

    def _generate(
        self,
        slot: Slot,
        prompt: list[int],
        params: GenerateParams,
        propose: Proposer | None,
        on_step: StepCallback | None,
        cache_points: Sequence[int] = (),
        cache_scope: str = "",
        request: Any = None,
    ) -> Iterator[Chunk]:
        """The prompt (``_prefill``), then a chunk per step until a finish: the draft
        (``_draft``), the shared step that verifies it (``_verify``), its tokens taken
        (``_advance``) up to a finish (``_finish_tokens``), and the chunk (``_chunk``)."""
        run = Run(self, slot, prompt, params, propose, on_step, request)
        self._prefill(run, cache_points, cache_scope)
        while run.finish is None:
            step = self._draft(run)
            self._verify(run, step)
            self._advance(run, step)
            self._finish_tokens(run, step)
            yield self._chunk(run, step)

    def _prefill(self, run: Run, cache_points: Sequence[int], cache_scope: str) -> None:
        """The prompt: reuse the longest common prefix the slot already holds (or a longer
        one from another conversation's checkpoint), evaluate the rest in chunks of shared
        steps and keep checkpoints on the way. The last prompt token stays out of the
        cache: the first decoding step evaluates it together with a draft."""
        slot, prompt = run.slot, run.prompt
        common = self._reusable_prefix(slot, self._held_prefix(slot, prompt))
        # ... or a longer prefix from another conversation's checkpoint
        new_conversation = common == 0
        common = self._restore_checkpoint(slot, cache_scope, prompt, common)
        common = self._await_checkpoint(slot, cache_scope, prompt, common)
        run.stats.cached_prompt_tokens = common
        # The prompt must fit; the generation stops ("length") where the context ends.
        self._make_room(slot, len(prompt) - common + 1)
        run.max_tokens = max(1, min(run.params.max_tokens, self.n_ctx - len(prompt)))
        points = self._checkpoint_points(prompt, common, cache_points, cache_scope,
                                         new_conversation)
        expected = self.prompt_cache.expect(cache_scope, prompt, points)
        end = len(prompt) - 1
        began = time.monotonic()  # its place among the prompts being evaluated
        try:
            while len(slot.tokens) < end:
                # in chunks the steps of the other generations leave room for, each
                # ending at the next checkpoint at the latest
                pos = len(slot.tokens)
                upto = min(end, pos + self.n_batch, *points[:1])
                part = StepRows(slot.seq_id, prompt[pos:upto], pos, room=self.n_batch,
                                prompt=True, since=began)
                with self._steps.step(part, run.request):
                    slot.tokens.extend(part.tokens[: part.kept])
                if points and len(slot.tokens) == points[0]:
                    self._save_checkpoint(slot, cache_scope)
                    points.pop(0)
                    self.prompt_cache.settle([expected.pop(0)])
        finally:
            self.prompt_cache.settle(expected)
        self.prompt_cache.remember_prompt(cache_scope, prompt)
        run.stats.prompt_s = time.perf_counter() - run.t_start

    def _await_checkpoint(self, slot: Slot, scope: str, prompt: list[int], common: int) -> int:
        """When a prefill under way will checkpoint a longer prefix of ``prompt`` than
        the slot holds (agents started at once on one system prompt), wait for it and
        restore it: its steps come first (prompts are served in order of arrival), so
        evaluating the prefix again beside them only delays both. Out of the step batch
        meanwhile, so that no step waits for this one's rows."""
        limit = len(prompt) - 1
        if self.restore_limit is not None:
            limit = min(limit, self.restore_limit)
        expected = self.prompt_cache.awaited(scope, prompt, common, limit)
        if expected is None:
            return common
        self._steps.leave()
        try:
            self.prompt_cache.wait(expected, CHECKPOINT_WAIT_S)
        finally:
            self._steps.join()
        return self._restore_checkpoint(slot, scope, prompt, common)

    def _checkpoint_points(self, prompt: list[int], common: int, cache_points: Sequence[int],
                           cache_scope: str, new_conversation: bool) -> list[int]:
        """The prompt positions past ``common`` where the prefill keeps a checkpoint."""
        points = self.prompt_cache.points(cache_scope, prompt, common, cache_points,
                                          new=new_conversation)
        if self.restore_limit is not None:  # deterministic mode would never restore them
            points = [p for p in points if p <= self.restore_limit]
        if not new_conversation and self._steps.shared():
            # A continuing conversation's prompt split a few tokens past what its slot
            # held costs the other sequences' step an extra ubatch and a step more for
            # this one (spider_dev, 8 agents: a 4-19-row chunk before each turn's
            # ~100); its slot keeps the whole prompt for a retry anyway.
            points = [p for p in points if p - common >= CHECKPOINT_SPLIT_MIN]
        return points

    def _draft(self, run: Run) -> Step:
        """This step's draft, cut where the grammar forbids a token, and the rows it asks
        of the shared step (the pending token, then the draft)."""
        slot, params = run.slot, run.params
        remaining = run.max_tokens - run.generated
        room = self.n_ctx - len(slot.tokens) - 1
        k = max(0, min(params.max_draft, remaining - 1, room, self.n_batch - 1))
        draft_obj = run.propose(run.context, k) if (run.propose is not None and k > 0) \
            else None
        path, source = draft_path(draft_obj)
        path = path[:k]
        if any(not 0 <= t < self.vocab_size for t in path):
            raise ValueError("drafter proposed a token outside the vocabulary")
        states, path = grammar_states(run.state, path)
        # A suffix-tree path draft may be cut by the step's joint plan (its calibrated
        # acceptance estimates say where); a grammar's drafts and others stay whole.
        probs = getattr(draft_obj, "probs", None)
        is_path = getattr(draft_obj, "is_path", None)
        trimmable = (self.joint_drafts and run.state is None and probs is not None
                     and len(probs) >= len(path) and hasattr(draft_obj, "head")
                     and callable(is_path) and is_path())
        want = len(path) + 1
        if trimmable and self._steps.shared():
            # other sequences step too: offer every candidate, the plan chooses
            draft_obj = draft_obj.extended()  # type: ignore[union-attr]
            path = draft_obj.path()[:k]
            probs = draft_obj.probs
        req = StepRows(slot.seq_id, [run.pending, *path], len(slot.tokens),
                       room=min(room + 1, self.n_batch),
                       probs=(list(probs[: len(path)])
                              if trimmable and probs is not None else None), want=want)
        return Step(draft_obj, path, source, states, req)

    def _verify(self, run: Run, step: Step) -> None:
        """The shared step: the draft as the plan cut it, verified (``verdict``); the
        rows past the accepted ones (rejected draft, padding) rolled back before the next
        step's decode."""
        req = step.req
        with self._steps.step(req, run.request):
            if req.kept - 1 < len(step.path):
                step.path = step.path[: req.kept - 1]
                step.draft = cut_draft(step.draft, len(step.path))
            if not step.path:
                step.source = "none"
            if req.shared == 1:
                self._observe_cost(req.kept, req.step_s)
            # Rows are read in place and only up to the first rejection: copying
            # 262k logits per drafted position costs more than the argmax.
            rows = LogitRows(self, len(step.path) + 1, req.offset)
            step.accepted, step.nxt = verdict(run, step, rows)
            if run.params.record_gaps:
                t_rec = time.perf_counter()
                step.gaps = gap_records(req, rows, step.states,
                                         [*step.path[:step.accepted], step.nxt])
                run.stats.record_s += time.perf_counter() - t_rec
            # Keep the evaluated pending token and the accepted draft; drop the rest
            # (padding included) before the next step's decode.
            keep = step.n_past + 1 + step.accepted
            if keep < step.n_past + req.rows:
                with self._mem_lock:
                    self._seq_rm(run.slot.seq_id, keep)
            req.emitted = step.accepted + 1

    def _advance(self, run: Run, step: Step) -> None:
        """After the step: the grammar, the slot and the counters take the accepted draft
        and the verifier's own token (``step.new``); the drafter hears how its draft
        fared."""
        accepted, nxt, path = step.accepted, step.nxt, step.path
        if run.state is not None:
            # the state after the accepted draft takes the verifier's own token
            run.state = step.states[accepted]
            if not run.state.allows(nxt):
                raise GrammarError("the grammar allows no token here (a dead end)")
            run.state.accept(nxt)
        run.slot.tokens.append(run.pending)
        run.slot.tokens.extend(path[:accepted])
        step.new = [*path[:accepted], nxt]
        run.pending = nxt
        stats = run.stats
        stats.steps += 1
        stats.drafted_tokens += len(path)
        stats.accepted_tokens += accepted
        if path:
            agg = stats.by_source.setdefault(step.source, [0, 0])
            agg[0] += len(path)
            agg[1] += accepted
        # Every step the drafter was asked about, empty drafts included: a step
        # without a draft is one token at the cost of one, and the drafter's
        # achieved rate (what each draft must beat) has to count it.
        if run.on_step is not None and step.draft is not None:
            run.on_step(step.draft, accepted, step.new)

    def _finish_tokens(self, run: Run, step: Step) -> None:
        """The finish conditions, token by token: the step's new tokens up to an
        end-of-generation token, a stop string or the length (``step.out``), their text
        decoded into ``run.text``."""
        params = run.params
        for tok in step.new:
            # a grammar ends where the model ends it, ignore_eos or not
            if (not params.ignore_eos or run.state is not None) and self.is_eog(tok):
                run.finish = "stop"
                step.eog = True
                break
            step.out.append(tok)
            run.generated += 1
            run.text += run.decoder.decode(self.token_bytes(tok))
            if params.stop:
                start = max(0, run.emitted - run.max_stop)
                hits = [i for s in params.stop if (i := run.text.find(s, start)) >= 0]
                if hits:
                    run.text = run.text[: min(hits)]
                    run.finish = "stop"
                    break
            if run.generated >= run.max_tokens:
                run.finish = "length"
                break

    def _chunk(self, run: Run, step: Step) -> Chunk:
        """The step's chunk: its output tokens and the text they release
        (``Run.text_piece``); the last one also carries the finish and the stats."""
        run.context.extend(step.new)
        stats = run.stats
        if run.t_first is None:
            run.t_first = time.perf_counter()
            stats.first_token_s = run.t_first - run.t_start - stats.record_s
            run.record_before_first = stats.record_s
        chunk = Chunk(
            text=run.text_piece(step.eog),
            tokens=step.out,
            source=step.source,
            proposed=len(step.path),
            accepted=step.accepted,
            # the end-of-generation token is not output, but its gap is kept so
            # that a run stopping where another goes on can be certified too
            gaps=step.gaps[: len(step.out) + int(step.eog)],
        )
        if run.finish is not None:
            now = time.perf_counter()
            stats.completion_tokens = run.generated
            stats.decode_s = now - (run.t_first or now) - (stats.record_s
                                                           - run.record_before_first)
            stats.total_s = now - run.t_start - stats.record_s
            chunk.finish_reason = run.finish
            if run.request is not None and run.request.queue_s is not None:
                stats.queue_s = run.request.queue_s
            chunk.stats = stats
        return chunk

    def close(self) -> None:
        """Free the context and the model. The caller makes sure no thread uses them any
        more (Generation.close: the measurement joined, every generation ended); the
        batcher's turn is taken anyway, so a step in flight ends before the free."""
        if self._closed:
            return
        self._measure_stop.set()
        with self._steps.exclusive():
            self._closed = True
            self._batch.close()
            self._ctx.close()
            self._model.close()
