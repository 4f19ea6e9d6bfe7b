"""llama-server as the benchmarks' reference: start it on a free loopback port, send it
a turn, read its own timings. Benchmark-only (bench/build_llama_server.sh builds it
from the llama.cpp source vendored in the installed llama-cpp-python); the command line's
options for it are in cli/llama_server.py."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suffixd.daemon.model import extra_weight_buffers

# llama-server's speculative type for a draft model: in this llama.cpp ``-md`` alone loads
# the draft model but drafts nothing.
DRAFT_SPEC_TYPE = "draft-simple"


def spec_types(binary: str | Path) -> list[str]:
    """The speculative types this llama-server offers without a second model."""
    out = subprocess.run([str(binary), "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    m = re.search(r"--spec-type\s+([\w,-]+)", out)
    if not m:
        return []
    return [t for t in m.group(1).split(",") if t.startswith("ngram")]


def draft_server_args(draft_model: str | Path, draft_max: int | None = None) -> list[str]:
    """llama-server's arguments, besides ``--spec-type DRAFT_SPEC_TYPE``, for drafting with
    ``draft_model`` (``draft_max``: its longest draft, else llama-server's default)."""
    args = ["-md", str(draft_model)]
    if draft_max is not None:
        args += ["--spec-draft-n-max", str(draft_max)]
    return args


def plain_of(name: str) -> str:
    """The llama-server plain decoding with the same flash-attention setting as ``name``
    (the names ``start_servers`` gives)."""
    return "ls-plain-fa-off" if name.endswith("-fa-off") else "ls-plain"


def start_servers(binary: str | Path, model: str | Path, *, threads: int, n_ctx: int,
                  spec_types_wanted: str | None, flash_attn: str,
                  plain: bool = True, n_parallel: int = 1,
                  extra_args: Sequence[str] = (), draft_model: str | Path | None = None,
                  draft_max: int | None = None) -> dict[str, LlamaServer]:
    """llama-server plain and with each n-gram type (``spec_types_wanted``: "T1,T2", or None
    for every type it offers), ready, keyed by the name the benches report ("ls-plain",
    "ls-ngram-mod"). ``flash_attn`` "both" runs each twice, its default (auto: on for the
    CPU) and off ("ls-plain-fa-off"): suffixd's verifier runs without flash attention, and
    on some models llama-server decodes faster without it too, so its best configuration
    is taken over both. ``plain`` False leaves plain decoding out. ``n_parallel``: slots
    per server (``n_ctx`` is then each slot's context, see ``LlamaServer``); ``extra_args``
    go to every server's command line. ``draft_model``: also llama-server drafting with
    it ("ls-draft", ``draft_server_args``; ``draft_max`` its longest draft)."""
    if spec_types_wanted:
        types = [t.strip() for t in spec_types_wanted.split(",") if t.strip()]
    else:
        types = spec_types(binary)
    settings = ["auto", "off"] if flash_attn == "both" else [flash_attn]
    # (name, --spec-type, arguments of its own)
    kinds: list[tuple[str, str | None, list[str]]] = [("plain", None, [])] if plain else []
    kinds += [(t, t, []) for t in types]
    if draft_model is not None:
        kinds.append(("draft", DRAFT_SPEC_TYPE, draft_server_args(draft_model, draft_max)))
    servers: dict[str, LlamaServer] = {}
    try:
        for fa in settings:
            for label, t, own in kinds:
                name = "ls-" + label + ("-fa-off" if fa == "off" else "")
                servers[name] = LlamaServer(binary, model, threads=threads, n_ctx=n_ctx,
                                            spec_type=t, flash_attn=fa,
                                            n_parallel=n_parallel,
                                            extra_args=[*extra_args, *own])
        for srv in servers.values():
            srv.wait_ready()
    except BaseException:
        for srv in servers.values():
            srv.close()
        raise
    return servers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Turn:
    tokens: list[int]
    prompt_n: int  # prompt tokens evaluated (not from its prompt cache)
    prompt_s: float
    predicted_n: int
    decode_s: float  # its own generation time (after the prompt)
    wall_s: float  # the request, as the client saw it
    drafted: int
    accepted: int


class LlamaServer:
    """One llama-server process (one slot unless ``n_parallel``, greedy requests, prompt
    cache on)."""

    def __init__(self, binary: str | Path, model: str | Path, *, threads: int, n_ctx: int,
                 spec_type: str | None = None, flash_attn: str = "auto",
                 log_path: Path | None = None, n_parallel: int = 1,
                 extra_args: Sequence[str] = ()) -> None:
        """``n_ctx`` 0: the model's trained context; ``flash_attn``: its ``-fa`` setting;
        ``extra_args`` appended to its command line.
        ``n_parallel`` slots (``-np``): llama-server divides ``-c`` among them, so ``-c`` is
        ``n_ctx`` × ``n_parallel`` and ``n_ctx`` each slot's context (then not 0)."""
        if n_parallel < 1 or (n_parallel > 1 and n_ctx <= 0):
            raise ValueError("n_parallel must be >= 1, and n_ctx (per slot) > 0 with several")
        self.port = _free_port()
        self.spec_type = spec_type or "none"
        self.n_parallel = n_parallel
        args = [str(binary), "-m", str(model), "-t", str(threads), "-tb", str(threads),
                "-c", str(n_ctx * n_parallel), "-np", str(n_parallel),
                "--host", "127.0.0.1", "--port", str(self.port), "-fa", flash_attn]
        if spec_type:
            args += ["--spec-type", spec_type]
        if not extra_weight_buffers():
            args.append("--no-repack")  # as suffixd's verifier (see extra_weight_buffers)
        args += extra_args
        self._log = open(log_path or "/dev/null", "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server ({self.spec_type}) exited with "
                                   f"{self.proc.returncode}")
            with contextlib.suppress(OSError, urllib.error.URLError), \
                    urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"llama-server ({self.spec_type}) did not become ready")

    def complete(self, prompt: Sequence[int], max_tokens: int,
                 grammar: str | None = None, json_schema: Any = None) -> Turn:
        """One greedy completion of ``prompt`` (constrained by the GBNF ``grammar``, or by
        the grammar llama-server builds itself from ``json_schema``). With several slots,
        llama-server picks one (the longest common prefix with the prompt)."""
        req_body: dict[str, Any] = {
            "prompt": list(prompt), "n_predict": max_tokens, "temperature": 0.0,
            "cache_prompt": True, "return_tokens": True,
            "id_slot": 0 if self.n_parallel == 1 else -1,
        }
        if grammar is not None:
            req_body["grammar"] = grammar
        if json_schema is not None:
            req_body["json_schema"] = json_schema
        body = json.dumps(req_body).encode()
        req = urllib.request.Request(self.url + "/completion", data=body,
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as r:
            out: dict[str, Any] = json.loads(r.read())
        wall = time.perf_counter() - t0
        t = out.get("timings", {})
        return Turn(
            tokens=[int(x) for x in out.get("tokens", [])],
            prompt_n=int(t.get("prompt_n", 0)),
            prompt_s=float(t.get("prompt_ms", 0.0)) / 1e3,
            predicted_n=int(t.get("predicted_n", 0)),
            decode_s=float(t.get("predicted_ms", 0.0)) / 1e3,
            wall_s=wall,
            drafted=int(t.get("draft_n", 0) or 0),
            accepted=int(t.get("draft_n_accepted", 0) or 0),
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


class BusyLoad:
    """``n`` processes spinning on the CPU beside a benchmark (a loaded machine)."""

    def __init__(self, n: int) -> None:
        import sys

        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(n)]

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
