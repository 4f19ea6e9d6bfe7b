"""Generation with the colocated verifier, for every front (gRPC Generate, the
OpenAI-compatible HTTP endpoint): one code path, so drafts, KV reuse, counters and
metrics are the same whichever protocol a request came in by.

Per request: render/tokenize the prompt; check every refusal it can meet before anything
changes (``Generation.check``: parameters, context window, the engine's limits), so a
refused request leaves no session, token or record; append what the session has not seen
yet to its tree (durably, kind "prompt"; a new session's record and prompt in one commit);
then run the verifier with drafts from the engine's trees (falling back to the draft
model when configured and worth it); every verified step is counted with
``engine.record_step``. The generated tokens reach the session tree at every step (kind
"generated", their commit queued) and the last ones are appended as "response", which
waits until everything is durable and puts the whole response into the namespace's
global tree.

The model is loaded on first use, or in the background at start-up
(daemon/server/startup.py): a daemon used only for speculate/append never pays for it.
Generation is ready once it is loaded: the verifier's costs come from the data dir
(cost_store.py) or are measured while serving (``Runtime``). The
draft model comes from ``engine.draft_model_path`` or the ``SUFFIXD_DRAFT_MODEL``
environment variable.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suffixcache import CostProfile

from ..common.errors import (
    AlreadyExists,
    FailedPrecondition,
    NotFound,
    ResourceExhausted,
)
from .chat import ChatRenderer
from .cost_measure import COST_SIZES, MAX_PROFILE_ROUNDS, MeasurementStopped
from .cost_store import FILE_NAME as COST_FILE
from .cost_store import ProfileStore, StoredCosts, profile_key
from .draft_model import (
    AdaptiveDrafter,
    DraftModel,
    draft_seconds_per_token,
    measure,
    provisional,
)
from .step_batch import Stopping
from .verifier import Chunk, GenerateParams, Verifier

log = logging.getLogger("suffixd.generate")

DEFAULT_MAX_TOKENS = 256
MAX_TOKENS_LIMIT = 8192
DEFAULT_DRAFT = 32
# Host memory for prompt checkpoints shared across sessions (serve --prompt-cache-mb);
# a checkpoint of 1,000 gemma-3-270m tokens takes ~11 MB.
DEFAULT_PROMPT_CACHE_MB = 1024
MAX_DRAFT = 64
# Relative change of a batch size's cost that makes serving's measurement replace the
# drafter's cost profile (below it: measurement noise).
PROFILE_DRIFT = 0.15
# Rounds of the start-up cost measurement (each batch shape keeps its fastest);
# SUFFIXD_COST_ROUNDS changes it (tests take 1), and the stored profile's key says which.
COST_ROUNDS = 5
# Deterministic mode when serve is given neither --deterministic nor --no-deterministic
# (see BENCHMARKS.md, "Deterministic mode", for what it costs)
DETERMINISTIC_DEFAULT = False


def deterministic_choice(option: bool | None) -> bool | None:
    """Whether the verifier runs in deterministic mode: ``serve --deterministic`` /
    ``--no-deterministic`` (True / False), else ``SUFFIXD_DETERMINISTIC`` (1 / 0), else
    None: the default, ``DETERMINISTIC_DEFAULT``, which falls back to the ordinary
    kernels (with a warning) where the mode's start-up check fails, where an explicit
    request fails the model's load instead."""
    if option is not None:
        return bool(option)
    env = os.environ.get("SUFFIXD_DETERMINISTIC", "").strip().lower()
    if env in ("1", "on", "true", "yes"):
        return True
    if env in ("0", "off", "false", "no"):
        return False
    return None if DETERMINISTIC_DEFAULT else False


def cost_sizes() -> int:
    """The largest batch size the cost measurement times: ``COST_SIZES``, or lower by
    ``SUFFIXD_COST_SIZES`` where the profile's upper sizes do not matter (tests about the
    measurement's scheduling, quick experiments)."""
    return max(1, int(os.environ.get("SUFFIXD_COST_SIZES") or COST_SIZES))


def cost_rounds() -> tuple[int, int]:
    """Rounds of a cost measurement and the cap on rounds added while its timings are
    implausible: ``COST_ROUNDS`` and ``MAX_PROFILE_ROUNDS``, or ``SUFFIXD_COST_ROUNDS``
    for both (the tests take 1: a tenth of the CPU, a noisier profile; 0: the daemon never
    measures, and plans with a stored profile or conservative costs)."""
    rounds = os.environ.get("SUFFIXD_COST_ROUNDS")
    if rounds:
        return max(0, int(rounds)), max(0, int(rounds))
    return COST_ROUNDS, MAX_PROFILE_ROUNDS


class Runtime:
    """The loaded models and their measured costs (created once).

    It serves as soon as the models are loaded. The costs come from the data dir when an
    earlier start with the same model, settings and CPU measured them
    (generation/cost_store.py); otherwise generations run with conservative costs (the
    drafter's CPU default, the verifier's 0.25 per extra row, no padding) while
    ``measure()`` runs on a thread of its own, and the measurement is used and stored
    once it ends. Costs change only how long drafts are and how batches are padded,
    never which tokens are accepted, so this changes no output."""

    def __init__(self, engine: Any, phase: Any = lambda what: None) -> None:
        path = getattr(engine, "model_path", None)
        if path is None:
            raise FailedPrecondition(
                "the daemon runs without a model (--model none): no generation"
            )
        t0 = time.monotonic()
        phase("loading model")
        if os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE":
            # llama.cpp's OpenMP threads then sleep between a graph's ~800 operations and
            # are woken for each: a one-token decode of gemma-3-270m on 2 cores took 44 ms
            # instead of 22, a 4-sequence step 73 instead of 54 (bench/shared_step_cost.py)
            log.warning("OMP_WAIT_POLICY=PASSIVE: small decodes cost up to 2x; unset it "
                        "unless the CPU is shared with other busy work")
        opts = getattr(getattr(engine, "serve_config", None), "extra", None) or {}
        n_gpu_layers = int(opts.get("n_gpu_layers") or 0)
        asked = deterministic_choice(opts.get("deterministic"))
        self.verifier = Verifier(
            path,
            n_ctx=int(opts.get("ctx_size") or os.environ.get("SUFFIXD_N_CTX", "8192")),
            n_threads=int(opts.get("threads") or os.environ.get("SUFFIXD_THREADS", "2")),
            n_slots=int(opts.get("kv_slots") or 4),
            n_gpu_layers=n_gpu_layers,
            prompt_cache_mb=int(opts.get("prompt_cache_mb", DEFAULT_PROMPT_CACHE_MB)),
            n_ubatch=int(os.environ.get("SUFFIXD_N_UBATCH", "0")) or None,
            deterministic=asked is not False,
        )
        if asked and not self.verifier.deterministic:
            why = self.verifier.determinism.get("why", "")
            self.verifier.close()
            raise FailedPrecondition(f"--deterministic: {why}")
        # SUFFIXD_JOINT_DRAFTS=0: shared steps keep every draft as its drafter cut it
        # (the comparison BENCHMARKS.md reports)
        self.verifier.joint_drafts = os.environ.get("SUFFIXD_JOINT_DRAFTS", "1") != "0"
        self.verifier.step_model = os.environ.get("SUFFIXD_STEP_MODEL", "0") == "1"
        self.renderer = ChatRenderer(self.verifier)
        # here, not in the first chat request (0.45 s on the Zen 3); on this thread, which
        # the verifier cannot be closed under
        phase("reading the vocabulary")
        self.renderer.prepare()
        self.engine = engine
        self.cost_profile: dict[str, float] = {}  # relative to one token; {}: not measured
        # "stored" (from the data dir), "measuring" (conservative costs until measure()
        # ends), "measured", "failed", "conservative" (never measured: SUFFIXD_COST_ROUNDS=0)
        self.profile_source = "measuring"
        self.fallback: AdaptiveDrafter | None = None
        self.draft_model: DraftModel | None = None
        draft_path = getattr(engine, "draft_model_path", None) or os.environ.get(
            "SUFFIXD_DRAFT_MODEL"
        )
        if draft_path:
            phase("loading draft model")
            self.draft_model = DraftModel(draft_path, self.verifier)
        self.measure_thread: threading.Thread | None = None  # started by Generation
        self.rounds, self.max_rounds = cost_rounds()
        self.sizes = cost_sizes()
        self.store = self._store(engine, Path(path), n_gpu_layers, draft_path)
        self.load_s = time.monotonic() - t0
        stored, why = self.store.load() if self.store is not None else (None, "no data dir")
        # measure() on a thread of its own once serving (Generation.runtime)
        self.needs_measuring = (stored is None or stored.distorted) and self.rounds > 0
        if stored is None and self.rounds == 0:
            self.profile_source = "conservative"
            log.info("verifier costs: none usable in the data dir (%s); serving with "
                     "conservative costs, not measured (SUFFIXD_COST_ROUNDS=0)", why)
        elif stored is not None:
            self._use(stored)
            self.profile_source = "stored"
            if stored.distorted:
                log.info("verifier costs: the stored ones were measured under heavy load; "
                         "serving with them while measuring again")
        else:
            log.info("verifier costs: none usable in the data dir (%s); serving with "
                     "conservative costs while measuring them", why)
        if self.draft_model is not None and self.fallback is None:
            # drafting from the first request, not once a measurement that a busy daemon
            # may never finish has ended
            self.fallback = provisional(self.verifier, self.draft_model)
            log.info("draft model policy, provisional until the verifier's costs are "
                     "measured: %s", self.fallback.stats())

    def _store(self, engine: Any, model: Path, n_gpu_layers: int,
               draft_path: Any) -> ProfileStore | None:
        data_dir = getattr(engine, "data_dir", None)
        if data_dir is None:
            return None
        v = self.verifier
        try:
            key = profile_key(model, n_threads=v.n_threads, n_batch=v.n_batch,
                              n_ubatch=v.n_ubatch, n_ctx=v.n_ctx,
                              n_slots=v.n_slots, n_gpu_layers=n_gpu_layers,
                              extra_buffers=v.extra_buffers, rounds=self.rounds,
                              sizes=self.sizes, deterministic=v.deterministic,
                              flash_attention=v.flash_attention,
                              draft_model=Path(draft_path) if draft_path else None)
        except OSError as exc:  # the model file went away after loading: measure, keep none
            log.warning("verifier costs will not be stored: %s", exc)
            return None
        return ProfileStore(Path(data_dir) / COST_FILE, key)

    def _use(self, costs: StoredCosts) -> None:
        """Plan drafts and batches with ``costs`` from now on (steps may be running)."""
        profile = self.verifier.restore_costs(costs.raw, costs.padded)
        self.cost_profile = {str(k): v for k, v in profile.items()}
        # The daemon's own drafter plans for its own verifier from now on: generation
        # drafts with it and its calibration learns from generation's verdicts (a
        # separate per-profile drafter would draft without ever learning).
        self.engine.drafter.set_cost_profile(CostProfile.from_json(self.cost_profile))
        log.info("verifier cost profile (relative to 1 token): %s", self.cost_profile)
        if self.draft_model is not None:
            policy = measure(self.verifier, self.draft_model,
                             draft_seconds=costs.draft_seconds_per_token)
            if self.fallback is not None:
                policy.carry_from(self.fallback)
            self.fallback = policy
            log.info("draft model policy: %s", self.fallback.stats())

    def measure(self) -> None:
        """Measure the verifier's (and the draft model's) costs, use and store them.

        Safe while generations run, and never in their way: each timed batch takes the
        model alone once no generation is active or waiting (StepBatcher.quiet_exclusive),
        so the timings are the model's own and a request waits for at most the one batch
        it arrived during; a continuously busy daemon measures nothing and plans with
        what serving's own steps cost meanwhile (Generation._refresh_cost_profile). The
        scratch KV slot is held for one batch at a time. Ends early, storing nothing,
        once ``stop()`` is called (the daemon stops)."""
        t0 = time.monotonic()
        self.profile_source = "measuring"  # also when a distorted stored one is in use
        try:
            v = self.verifier
            v.measure_cost_profile(ks=range(1, self.sizes + 1), reps=self.rounds,
                                   max_rounds=self.max_rounds)
            draft_s = (draft_seconds_per_token(v, self.draft_model)
                       if self.draft_model is not None else None)
            costs = StoredCosts(dict(v.raw_cost_seconds), dict(v.padded_cost_seconds),
                                draft_s, v.costs_distorted)
            self._use(costs)
        except MeasurementStopped:
            log.info("verifier cost measurement stopped; measured again at the next start")
            return
        except Exception:
            self.profile_source = "failed"
            log.exception("measuring the verifier's costs failed; serving goes on with "
                          "conservative costs")
            return
        stored = ""
        if self.store is not None:
            try:
                self.store.save(costs)
                stored = str(self.store.path)
            except OSError as exc:  # a full disk: measured again at the next start
                log.warning("verifier costs not stored: %s", exc)
        log.info("verifier costs measured", extra={"seconds": round(time.monotonic() - t0, 1),
                                                   "stored": stored,
                                                   "distorted": costs.distorted,
                                                   "load": json.dumps(v.cost_load)})
        # Last: a status that says "measured" means the profile is stored and logged (a
        # fresh-clone CI run once read the log between the two).
        self.profile_source = "measured"

    def start_measuring(self) -> None:
        if self.needs_measuring and self.measure_thread is None:
            self.measure_thread = threading.Thread(target=self.measure,
                                                   name="suffixd-cost-measure", daemon=True)
            self.measure_thread.start()

    def close(self, timeout: float) -> bool:
        """Stop the measurement, wait for its thread, then free the models: whether they
        were freed (not while the measurement still runs: a free under a running decode
        crashes the process)."""
        self.verifier.stop_measuring()
        t = self.measure_thread
        if t is not None:
            t.join(timeout)
            if t.is_alive():
                return False
        if self.draft_model is not None:
            self.draft_model.close()
        self.verifier.close()
        return True


@dataclass
class GenerationRequest:
    """What to generate, whatever the front. Exactly one of text, tokens, messages."""

    namespace: str = "default"
    # empty: a one-off request: it drafts from the namespace's trees and its response
    # enters the global tree (through a session of its own, closed at the end)
    session_id: str = ""
    text: str | None = None
    tokens: list[int] | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    tools: Sequence[Mapping[str, Any]] | None = None  # for a chat template with tool support
    grammar: str | None = None  # GBNF the output must match (grammar.py)
    add_bos: bool = True  # text prompts only
    max_tokens: int = 0  # 0: DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: Sequence[str] = field(default_factory=tuple)
    ignore_eos: bool = False
    max_draft_tokens: int = 0  # 0: DEFAULT_DRAFT

    def params(self) -> GenerateParams:
        if self.max_tokens > MAX_TOKENS_LIMIT:
            raise ValueError(f"max_tokens above the limit of {MAX_TOKENS_LIMIT}")
        if self.max_tokens < 0:
            raise ValueError("max_tokens must be >= 1")
        return GenerateParams(
            max_tokens=self.max_tokens or DEFAULT_MAX_TOKENS,
            temperature=float(self.temperature),
            top_p=float(self.top_p) or 1.0,
            top_k=int(self.top_k),
            seed=self.seed,
            stop=list(self.stop),
            ignore_eos=self.ignore_eos,
            max_draft=min(self.max_draft_tokens or DEFAULT_DRAFT, MAX_DRAFT),
            grammar=self.grammar,
        )


class Generation:
    """The daemon's generator (``engine.generator``): loads the runtime once, turns a
    GenerationRequest into verified chunks. Thread-safe: the verifier's turn queue
    shares the model between concurrent requests."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._runtime: Runtime | None = None
        self._load_lock = threading.Lock()
        self.phase = ("", 0.0)  # (what the first load is doing, since when)
        # (ns, sid) -> the tokens this generator last appended for the session (prompt +
        # response), so a follow-up prompt that repeats them appends only its new part
        self._seen: dict[tuple[str, str], list[int]] = {}
        self._seen_lock = threading.Lock()
        self.profile_updates = 0  # times serving's costs replaced the drafter's profile
        self._ready_lock = threading.Lock()
        self._on_ready: list[Callable[[], None]] = []
        # when `suffixd serve` started (daemon/server/serve.py sets it), for the ready line
        self.started = getattr(engine, "serve_started", None) or time.monotonic()
        # The generations running (their cancel events) and whether the daemon stops:
        # stop() cancels them, close() waits for them before the models are freed.
        self._runs: set[threading.Event] = set()
        self._runs_cond = threading.Condition()
        self._closing = False

    @property
    def stopping(self) -> bool:
        """Whether the daemon stops (``stop``): a generation ending early ended for that."""
        return self._closing

    @property
    def loaded(self) -> Runtime | None:
        """The runtime if it is loaded: a generation can be served at once (asking must
        not cost a model load)."""
        return self._runtime

    def when_ready(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` once a generation can be served (now if it can already); from the
        loading thread, so ``fn`` must not block (gRPC health, daemon/server/serve.py)."""
        with self._ready_lock:
            if self._runtime is None:
                self._on_ready.append(fn)
                return
        fn()

    def runtime(self) -> Runtime:
        with self._load_lock:
            rt = self._runtime
            if rt is None:
                if self._closing:
                    raise Stopping
                try:
                    rt = Runtime(self.engine, self._set_phase)
                except Exception as exc:
                    self._set_phase(f"failed: {exc}")
                    raise
                # logged before the runtime is published: whoever sees /health answer 200
                # can read the line that says so
                log.info("generation ready", extra={
                    "since_start_s": round(time.monotonic() - self.started, 1),
                    "load_s": round(rt.load_s, 1), "cost_profile": rt.profile_source})
                with self._ready_lock:
                    self._runtime = rt
                    ready, self._on_ready = self._on_ready, []
                if self._closing:  # stop() ran during the load, before there was a verifier
                    rt.verifier.stop_generating()
                self._set_phase("")
                for fn in ready:
                    try:
                        fn()
                    except Exception:  # a health flag not set must not fail the load
                        log.exception("a readiness callback failed")
                if not self._closing:
                    rt.start_measuring()
            return rt

    def stop(self, timeout: float) -> int:
        """The daemon stops: new generations are refused and every running one ends at its
        next step (``Stopping``: UNAVAILABLE on gRPC, a 503 or a final error event on the
        OpenAI endpoint; a long prompt between two of its chunks), the cost measurement at
        its next batch. Waits up to ``timeout`` seconds for them to end, so that the fronts
        answer them before they close; returns how many still run. Their steps are not
        waited out: a generation's own end can be thousands of tokens away, past any
        orchestrator's grace period."""
        deadline = time.monotonic() + timeout
        with self._runs_cond:
            self._closing = True
            for cancelled in self._runs:
                cancelled.set()
        rt = self._runtime
        if rt is not None:  # (else runtime() stops the verifier it loads)
            rt.verifier.stop_measuring()
            rt.verifier.stop_generating()
        with self._runs_cond:
            while self._runs and (left := deadline - time.monotonic()) > 0:
                self._runs_cond.wait(left)
            return len(self._runs)

    def close(self, timeout: float = 30.0) -> bool:
        """Stop generating (``stop``), wait for the generations, a model load in progress
        and the cost measurement, and only then free the models. llama.cpp must not be
        freed, nor the process exit, under a thread still inside it (a SIGTERM during
        the measurement crashed the process). Returns whether everything ended within
        ``timeout`` seconds (if not, nothing is freed; ``still_running`` says what)."""
        deadline = time.monotonic() + timeout
        if self.stop(timeout):
            return False
        # (after the generations: one may be waiting for the model to load)
        if not self._load_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False
        try:
            rt = self._runtime
            return rt is None or rt.close(max(0.0, deadline - time.monotonic()))
        finally:
            self._load_lock.release()

    def still_running(self) -> list[str]:
        """What kept ``close`` from freeing the models (threads that may be inside
        llama.cpp), for the daemon's last warning."""
        with self._runs_cond:
            n = len(self._runs)
        out = [f"{n} generation{'' if n == 1 else 's'}"] if n else []
        if self._runtime is None and self.phase[0] and not self.phase[0].startswith("failed"):
            out.append("the model load")
        rt = self._runtime
        if rt is not None and rt.measure_thread is not None and rt.measure_thread.is_alive():
            out.append("the cost measurement")
        return out

    def not_ready(self) -> str:
        """Why no generation can be served yet (for /health), "" once one can."""
        if self._closing:  # a load balancer sends its next requests elsewhere
            return "The daemon is stopping"
        if self._runtime is not None:
            return ""
        if getattr(self.engine, "model_path", None) is None:
            return "No model (the daemon runs with --model none)"
        phase = self.phase[0]
        if phase.startswith("failed"):
            return f"Model load {phase}"
        opts = getattr(getattr(self.engine, "serve_config", None), "extra", None) or {}
        if not phase and opts.get("model_load", "first-use") == "first-use":
            return "Model not loaded (--model-load first-use: the first generation loads it)"
        return "Loading model"

    def _set_phase(self, what: str) -> None:
        self.phase = (what, time.monotonic())

    def prompt_tokens(self, req: GenerationRequest) -> list[int]:
        rt = self.runtime()
        given = [x is not None for x in (req.text, req.tokens, req.messages)]
        if sum(given) != 1:
            raise ValueError("no prompt: give text, tokens or messages")
        if req.text is not None:
            toks = rt.verifier.tokenize(req.text, add_bos=req.add_bos)
        elif req.tokens is not None:
            toks = [int(t) for t in req.tokens]
        else:
            toks = rt.renderer.tokens(req.messages or [], tools=req.tools)
        if not toks:
            raise ValueError("empty prompt")
        if any(not 0 <= t < rt.verifier.vocab_size for t in toks):
            raise ValueError(f"token ids must be in [0, {rt.verifier.vocab_size})")
        return toks

    def check(self, req: GenerationRequest, prompt: list[int]) -> bool:
        """Every refusal a request can meet before it changes anything: its parameters,
        the context window (the prompt and one generated token must fit a KV slot) and,
        for a named session, the engine's limits on the state it will open or extend
        (``Engine.check_admission``: namespace, session count, budgets, tokens per call).
        Both fronts go through it (``run`` calls it first; the HTTP front also before it
        picks an automatic session), so a refused request opens no session, stores no
        token and leaves no record. Returns whether the named session is open (False for
        a one-off, which runs without a session where it may not open one)."""
        req.params().validate()
        self.runtime().verifier.check_fits(len(prompt))
        if not req.session_id:
            return False
        ns, sid = req.namespace or "default", req.session_id
        is_open = bool(self.engine.check_admission(ns, sid, 0))
        # what run() will append: the prompt's new part, or all of it with the opening
        n = len(self._new_prompt_part((ns, sid), prompt)) if is_open else len(prompt)
        self.engine.check_admission(ns, sid, n)
        return is_open

    def _new_prompt_part(self, key: tuple[str, str], prompt: list[int]) -> list[int]:
        with self._seen_lock:
            seen = self._seen.get(key)
        if seen and prompt[: len(seen)] == seen:
            return prompt[len(seen) :]
        return prompt

    def _refresh_cost_profile(self, rt: Runtime) -> None:
        """Plan drafts with what verification costs now (Verifier.live_cost_profile): a
        profile that moved by more than PROFILE_DRIFT at some size replaces the drafter's.
        Drafting must pay on a loaded machine as on a quiet one."""
        live = rt.verifier.live_cost_profile()
        if live is None:
            return
        current = {int(k): v for k, v in rt.cost_profile.items()}
        if all(abs(live[k] - current.get(k, live[k])) <= PROFILE_DRIFT * current.get(k, 1.0)
               for k in live):
            return
        rt.cost_profile = {str(k): v for k, v in live.items()}
        self.engine.drafter.set_cost_profile(CostProfile.from_json(rt.cost_profile))
        self.profile_updates += 1
        log.info("verifier cost profile updated from serving: %s", rt.cost_profile)

    def forget_session(self, ns: str, sid: str) -> None:
        with self._seen_lock:
            self._seen.pop((ns, sid), None)

    def run(
        self,
        req: GenerationRequest,
        cancelled: threading.Event | None = None,
        prompt: list[int] | None = None,
    ) -> Iterator[Chunk]:
        """Verified chunks of ``req``; the last one has a finish reason and the totals.
        Stops early (between two steps) once ``cancelled`` is set: the session keeps what
        was generated so far, and the verifier's slot is released."""
        cancel = cancelled if cancelled is not None else threading.Event()
        with self._runs_cond:
            if self._closing:
                raise Stopping
            self._runs.add(cancel)
        try:
            yield from self._run(req, cancel, prompt)
        finally:
            with self._runs_cond:
                self._runs.discard(cancel)
                self._runs_cond.notify_all()

    def _run(self, req: GenerationRequest, cancelled: threading.Event,
             prompt: list[int] | None) -> Iterator[Chunk]:
        engine = self.engine
        ns = req.namespace or "default"
        sid = req.session_id
        params = req.params()
        rt = self.runtime()
        if prompt is None:
            prompt = self.prompt_tokens(req)
        # Every refusal before the first change: a refused request leaves nothing.
        session_open = self.check(req, prompt)
        oneoff = not sid
        # The session stays held until the generation ends (engine.hold_session): the
        # idle reaper never closes it under a generation, whose prompt evaluation or wait
        # for the model may append nothing for longer than --session-idle-timeout.
        held: Any = None
        if oneoff:
            # A one-off request learns too: it runs in a session of its own, closed at the
            # end with its response kept (in the namespace's global tree, durably), so the
            # same request again is drafted from this one. Where the namespace allows no
            # more sessions it still drafts from the trees, learning nothing.
            sid = f"oneoff-{uuid.uuid4().hex}"
            try:
                # record + prompt: one commit
                engine.open_session(ns, sid, tokens=prompt, hold=True)
            except (ResourceExhausted, FailedPrecondition) as exc:
                log.info("one-off request in %r not remembered: %s", ns, exc)
                sid = ""
            else:
                held = engine.stream_session(ns, sid)
        else:
            held = engine.hold_session(ns, sid) if session_open else None
            if held is None:  # not open, or closed since check()
                self.forget_session(ns, sid)  # what a closed session of that id had seen
                try:
                    # A new session's record and prompt commit together: a failed write
                    # (a full disk) leaves no empty session behind.
                    engine.open_session(ns, sid, tokens=prompt, hold=True)
                    held = engine.stream_session(ns, sid)
                    session_open = False
                except AlreadyExists:  # opened meanwhile by another request
                    held = engine.hold_session(ns, sid)
                    if held is None:
                        raise NotFound(f"session {sid!r} in namespace {ns!r} was closed "
                                       "while this request opened it") from None
                    session_open = True
        try:
            yield from self._generate(rt, req, params, prompt, ns, sid, oneoff,
                                      session_open and held is not None, held, cancelled)
        finally:
            if held is not None:
                engine.release_session(held)
            if oneoff and sid:
                self._close_oneoff(ns, sid)

    def _generate(self, rt: Runtime, req: GenerationRequest, params: GenerateParams,
                  prompt: list[int], ns: str, sid: str, oneoff: bool, append_prompt: bool,
                  sess: Any, cancelled: threading.Event) -> Iterator[Chunk]:
        """``run`` once the session is held: the prompt's new part appended (when the
        session was open already), then the verifier's chunks."""
        engine = self.engine
        if append_prompt:
            new = self._new_prompt_part((ns, sid), prompt)
            if new:
                engine.append(ns, sid, "prompt", new)
        # a one-off's KV is its own, forgotten at the end; a session's stays for its next turn
        vkey = f"\x00oneoff-{uuid.uuid4().hex}" if oneoff else f"{ns}\x00{sid}"

        fallback = rt.fallback
        fed = [len(prompt)]  # context tokens the session already holds

        def propose(ctx: list[int], k: int) -> Any:
            if sess is not None and len(ctx) > fed[0]:
                # The session tree follows the response step by step, so a response that
                # repeats itself is drafted from its own beginning. Each step's tokens
                # go to the trees now and their commit is queued; the final "response"
                # append waits for all of them (the store commits in order).
                engine.step(sess, "generated", ctx[fed[0] :], draft=False, defer_commit=True)
                fed[0] = len(ctx)
            # A one-off request (no session) still drafts from its namespace's global
            # and corpus trees.
            draft = engine.propose(ns, sid or None, ctx, max_tokens=k, remember=False)
            if (draft is None or not len(draft.tokens)) and fallback is not None:
                model_draft = fallback(ctx, k, vkey)
                if model_draft is not None:
                    return model_draft
            return draft

        def on_step(draft: Any, accepted: int, new: list[int]) -> None:
            path = draft.path()
            if getattr(draft, "source", "") == "draft_model" and fallback is not None:
                fallback.observe(draft, accepted)
            engine.record_step(
                ns,
                sid or None,
                draft.source if path else "none",
                len(path),
                accepted,
                draft=draft,
                accepted_tokens=new,
            )

        generated: list[int] = []
        self._refresh_cost_profile(rt)
        hints: list[int] = []
        if req.messages and rt.verifier.prompt_cache.enabled:
            hints = rt.renderer.cache_points(req.messages, req.tools, prompt)
        try:
            for chunk in rt.verifier.generate(vkey, prompt, params, propose, on_step,
                                              cache_points=hints, cache_scope=ns):
                if cancelled.is_set():
                    if self._closing:  # not the client's doing: say why it ended early
                        raise Stopping
                    break
                generated += chunk.tokens
                if chunk.finish_reason is not None and sid:
                    # The rest of the response (possibly empty) ends it, durably, and puts
                    # the whole response into the namespace's global tree.
                    engine.append(ns, sid, "response", generated[fed[0] - len(prompt) :])
                    with self._seen_lock:
                        self._seen[(ns, sid)] = prompt + generated
                # Before the yield: a consumer that stops at the final chunk (the HTTP
                # front's Run) never resumes this generator, and the totals went uncounted.
                hook = getattr(engine, "on_generate", None)  # metrics, dashboard history
                if hook is not None and chunk.stats is not None:
                    hook(ns, chunk.stats)
                yield chunk
        finally:
            if oneoff:
                rt.verifier.forget(vkey)

    def _close_oneoff(self, ns: str, sid: str) -> None:
        try:
            self.engine.close_session(ns, sid, keep_responses=True)
        except NotFound:
            pass  # closed meanwhile (e.g. the namespace was dropped)
        except Exception:  # the request's own outcome stands; the session expires later
            log.exception("closing the one-off session %s/%s", ns, sid)
        self.forget_session(ns, sid)
