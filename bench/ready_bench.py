"""Time from `suffixd serve` to the first served generation, without and with a stored
cost profile (issue 26).

Starts a real ``suffixd serve --http 127.0.0.1:0 --model-load startup`` on a fresh data
dir, as a client would use it: polls ``GET /health`` from the moment the process is
started until it answers 200, then sends one ``/v1/completions`` request (greedy, a few
tokens) and waits for its answer. Then stops the daemon (once its cost measurement has
been stored) and starts it again on the same data dir, now with the stored profile.
Reports, per start: seconds to the first /health 200, to the first generation's answer,
the daemon's own ``generation ready`` line, and how long the background measurement
took (first start only).

    python bench/ready_bench.py [--model PATH] [--threads N] [--load N] [--max-tokens N]

``--load N`` runs N busy processes beside the daemon (a loaded machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from suffixd.client.launch import LaunchError, LocalDaemon


def one_start(daemon: LocalDaemon, max_tokens: int, wait_stored: bool) -> dict[str, Any]:
    """Start ``daemon`` and time it (its log read from this start on)."""
    t0 = time.monotonic()
    try:
        daemon.start(timeout=3600)  # a loaded machine (--load) may take long
    except LaunchError as exc:
        raise SystemExit(str(exc)) from None
    out: dict[str, Any] = {"announced_s": round(time.monotonic() - t0, 2)}
    try:
        base = str(daemon.http)
        n503 = 0
        while httpx.get(daemon.health_url, timeout=60).status_code != 200:
            n503 += 1
            time.sleep(0.02)
        out["health_200_s"] = round(time.monotonic() - t0, 2)
        out["health_503_answers"] = n503
        r = httpx.post(f"{base}/completions", timeout=3600, json={
            "model": "default", "prompt": "SELECT name, country FROM singer WHERE",
            "max_tokens": max_tokens, "temperature": 0})
        r.raise_for_status()
        out["first_generation_s"] = round(time.monotonic() - t0, 2)
        ready = re.search(r'"generation ready" (.*)', daemon.log(since_start=True))
        out["ready_line"] = ready.group(1).strip() if ready else None
        if wait_stored:
            while "verifier costs measured" not in daemon.log(since_start=True):
                if not daemon.running():
                    raise SystemExit(f"the daemon exited: {daemon.log_tail()}")
                time.sleep(0.5)
            m = re.search(r'"verifier costs measured" seconds=(\S+)',
                          daemon.log(since_start=True))
            out["background_measurement_s"] = float(m.group(1)) if m else None
    finally:
        daemon.stop(120)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF (default: the embedded model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--load", type=int, default=0, help="busy processes beside the daemon")
    a = ap.parse_args()
    args = ["--threads", str(a.threads)] + (["--model", a.model] if a.model else [])
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(a.load)]
    try:
        with tempfile.TemporaryDirectory(prefix="suffixd-ready-") as tmp:
            data = Path(tmp) / "data"
            daemon = LocalDaemon(data, ["--http", "127.0.0.1:0", "--model-load", "startup",
                                        *args], log_path=Path(tmp) / "serve.log")
            fresh = one_start(daemon, a.max_tokens, wait_stored=True)
            stored = one_start(daemon, a.max_tokens, wait_stored=False)
            mode = oct((data / "cost_profile.json").stat().st_mode & 0o777)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    print(json.dumps({"cpus": os.cpu_count(), "threads": a.threads, "load_processes": a.load,
                      "max_tokens": a.max_tokens, "no_stored_profile": fresh,
                      "stored_profile": stored, "profile_file_mode": mode}, indent=1))


if __name__ == "__main__":
    main()
