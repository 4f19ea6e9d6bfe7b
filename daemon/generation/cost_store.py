"""The measured cost profile, kept in the data dir so that a restart serves at once.

Measuring what verifying a batch of 1..33 tokens costs takes ~20 s on a quiet 2-core
machine and minutes on a busy one; it depends only on the model file, the context's
settings, the CPU and the llama.cpp build. So the measurement is stored in
``<data dir>/cost_profile.json`` with the key it was made under (``profile_key``), and
a start whose key matches takes it from there. A file that cannot be read, does not
parse, or was made under another key is ignored (one log line says why), never an
error: the daemon then serves with a conservative profile and measures again.

Interface: ``profile_key(...)`` -> the key (a flat dict of strings and numbers);
``ProfileStore(path, key)`` with ``load()`` -> ``(StoredCosts | None, why)`` and
``save(costs)`` (atomic: a temporary file, fsync, rename; mode 0600);
``StoredCosts`` (raw and padded seconds per batch shape, the draft model's seconds
per token, whether machine load distorted the measurement: such a profile is used, and
measured again while serving, so one busy start does not leave a bad profile for good).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE_NAME = "cost_profile.json"
# Bumped when the measurement or the file's layout changes: older files are ignored.
FORMAT = 1


def cpu_identity() -> tuple[str, str]:
    """The CPU model as the kernel names it, and a digest of its feature flags: costs
    differ between CPUs of one arch, and a VM's CPU may be named only "Intel Xeon
    Processor" whatever it is (the flags say whether AVX-512 or AMX kernels run)."""
    name, flags = "", ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            field, _, value = line.partition(":")
            field = field.strip().lower()
            if not name and field in ("model name", "cpu model", "hardware"):
                name = value.strip()
            elif not flags and field in ("flags", "features"):
                flags = hashlib.sha256(" ".join(sorted(value.split())).encode()).hexdigest()[:16]
    return name or platform.processor() or platform.machine(), flags


def _file_identity(path: Path) -> dict[str, Any]:
    """Path, size and modification time: a replaced or re-downloaded file differs (a
    hash of a multi-gigabyte GGUF would cost seconds at every start)."""
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def profile_key(
    model: Path,
    *,
    n_threads: int,
    n_batch: int,
    n_ctx: int,
    n_slots: int,
    n_gpu_layers: int,
    extra_buffers: bool,
    rounds: int,
    draft_model: Path | None = None,
) -> dict[str, Any]:
    """What a measured profile depends on. ``n_ctx`` (per slot) sets the measurement's
    context length when small; ``n_slots`` the context's KV streams; ``extra_buffers``
    and the llama.cpp build which kernels run; the CPU and the cores it may use how fast
    they run, and OpenMP's wait policy how much each decode pays to wake its threads;
    ``rounds`` how many repetitions the fastest time was taken over."""
    import llama_cpp

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 0
    cpu, flags = cpu_identity()
    key: dict[str, Any] = {
        "format": FORMAT,
        "model": _file_identity(model),
        "n_threads": n_threads,
        "n_batch": n_batch,
        "n_ctx": n_ctx,
        "n_slots": n_slots,
        "n_gpu_layers": n_gpu_layers,
        "extra_buffers": extra_buffers,
        "rounds": rounds,
        "cpu": cpu,
        "cpu_flags": flags,
        "cpu_count": os.cpu_count() or 0,
        "cores_allowed": cores,
        "machine": platform.machine(),
        "llama_cpp_python": str(getattr(llama_cpp, "__version__", "?")),
        "draft_model": _file_identity(draft_model) if draft_model is not None else None,
        # how llama.cpp's OpenMP threads wait between operations: PASSIVE doubled a
        # one-token decode on 2 cores (research log, 2026-11-26)
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "").strip().upper(),
    }
    return key


@dataclass
class StoredCosts:
    """What the measurement produced: seconds per batch of k tokens (every row with
    logits), seconds of a j-token batch with logits for its first k rows (keyed (k, j)),
    and the draft model's seconds per drafted token (None: no draft model)."""

    raw: dict[int, float]
    padded: dict[tuple[int, int], float]
    draft_seconds_per_token: float | None = None
    # measured under heavy load (Verifier.costs_distorted): used, and measured again
    distorted: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "raw": {str(k): v for k, v in sorted(self.raw.items())},
            "padded": [[k, j, v] for (k, j), v in sorted(self.padded.items())],
            "draft_seconds_per_token": self.draft_seconds_per_token,
            "distorted": self.distorted,
        }

    @classmethod
    def from_json(cls, data: Any) -> StoredCosts:
        """Raises ValueError (or TypeError) on anything but a well-formed measurement."""
        def seconds(v: Any) -> float:
            if isinstance(v, bool) or not isinstance(v, (int, float)) \
                    or not math.isfinite(v) or v <= 0:
                raise ValueError(f"not a duration: {v!r}")
            return float(v)

        raw = {int(k): seconds(v) for k, v in dict(data["raw"]).items()}
        if 1 not in raw or any(k < 1 for k in raw):
            raise ValueError("no one-token cost")
        padded: dict[tuple[int, int], float] = {}
        for k, j, v in data["padded"]:
            if not (isinstance(k, int) and isinstance(j, int) and 1 <= k < j):
                raise ValueError(f"not a padded shape: {k!r}, {j!r}")
            padded[(k, j)] = seconds(v)
        d = data.get("draft_seconds_per_token")
        return cls(raw, padded, None if d is None else seconds(d), data.get("distorted") is True)


def _differences(stored: Any, key: dict[str, Any]) -> str:
    if not isinstance(stored, dict):
        return "no key"
    diff = [f"{k} {stored.get(k)!r} -> {v!r}" for k, v in key.items() if stored.get(k) != v]
    diff += [f"{k} {v!r} -> absent" for k, v in stored.items() if k not in key]
    return "; ".join(diff)


class ProfileStore:
    """``<data dir>/cost_profile.json``: one measured profile and the key it holds for."""

    def __init__(self, path: Path, key: dict[str, Any]) -> None:
        self.path = Path(path)
        self.key = key

    def load(self) -> tuple[StoredCosts | None, str]:
        """The stored costs if the file holds a measurement made under this key, and a
        few words on why not otherwise (for the log)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None, "none stored"
        except OSError as exc:
            return None, f"unreadable ({exc.strerror or exc})"
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("not an object")
            # JSON round trip: the key as stored compares equal to a fresh one
            key = json.loads(json.dumps(self.key))
            if data.get("key") != key:
                return None, f"measured under other settings ({_differences(data.get('key'), key)})"
            return StoredCosts.from_json(data["costs"]), "stored"
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            return None, f"corrupt ({type(exc).__name__}: {exc})"

    def save(self, costs: StoredCosts) -> None:
        """Write atomically (a reader sees the old file or the new one, whole) and
        owner-only, like everything in the data dir."""
        body = json.dumps({"key": self.key, "costs": costs.to_json(),
                           "measured_at": time.time()}, indent=1)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a leftover file
                os.write(fd, body.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        with contextlib.suppress(OSError):  # the rename itself durable
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
