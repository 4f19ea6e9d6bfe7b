"""The measured cost profile, kept in the data dir so that a restart serves at once.

Measuring what verifying a batch of 1..33 tokens costs takes ~20 s on a quiet 2-core
machine and minutes on a busy one; it depends only on the model file, the context's
settings, the CPU and the llama.cpp build. So the measurement is stored in
``<data dir>/cost_profile.json`` with the key it was made under (``profile_key``), and
a start whose key matches takes it from there. A file that cannot be read, does not
parse, was made under another key, or holds costs no measurement gives (checked as a
whole: ``check_plausible``) is ignored (one log line says why), never an error: the
daemon then serves with a conservative profile and measures again. The file is opened
without following a symbolic link, and one that is not a regular file (a link, a FIFO:
opening one for reading would block the model load) is refused the same way.

Interface: ``profile_key(...)`` -> the key (a flat dict of strings and numbers);
``ProfileStore(path, key)`` with ``load()`` -> ``(StoredCosts | None, why)`` and
``save(costs)`` (atomic: a temporary file, fsync, rename; mode 0600); ``read_regular``
(a data dir file's text, no link followed; ``NotRegular``);
``StoredCosts`` (raw and padded seconds per batch shape, the draft model's seconds
per token, whether machine load distorted the measurement: such a profile is used, and
measured again while serving, so one busy start does not leave a bad profile for good).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import platform
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cost_measure import COST_SIZES

FILE_NAME = "cost_profile.json"
# Bumped when the measurement or the file's layout changes: older files are ignored.
# 2: measured with every decode on one thread (compute_thread); format 1's small
# batches were timed up to 1.6x dear, OpenMP sleeping at barriers
FORMAT = 2
# What a stored profile may hold. Any decode takes more than a microsecond, and one
# batch over a minute leaves nothing to serve. A batch costs at least a fraction of one
# token (measurement noise on a flat GPU profile, never 1e-12 of it) and at most that
# many tokens decoded one by one, with room for noise; the drafter plans with the costs
# relative to one token, rounded to 3 decimals, so a ratio that rounds to 0 or overflows
# would fail the profile on every request.
MIN_SECONDS = 1e-6
MAX_SECONDS = 60.0
MIN_RATIO = 1 / 8
MAX_RATIO_PER_TOKEN = 8.0
MAX_BATCH = 1 << 16
MAX_SHAPES = 4096
MAX_FILE_BYTES = 1 << 20


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
    n_ubatch: int | None = None,
    n_slots: int,
    n_gpu_layers: int,
    extra_buffers: bool,
    rounds: int,
    draft_model: Path | None = None,
    sizes: int = COST_SIZES,
    deterministic: bool = False,
    flash_attention: bool = False,
) -> dict[str, Any]:
    """What a measured profile depends on. ``n_ctx`` (per slot) sets the measurement's
    context length when small; ``n_slots`` the context's KV streams; ``extra_buffers``
    and the llama.cpp build which kernels run; the CPU and the cores it may use how fast
    they run, and OpenMP's wait policy how much each decode pays to wake its threads;
    ``rounds`` how many repetitions the fastest time was taken over; ``sizes`` the largest
    batch timed (a key without it is the default's, so stored profiles stay valid);
    ``deterministic`` the verifier's deterministic mode (other kernels, padded one-row
    decodes; in the key only when on, for the same reason); ``flash_attention`` whether the
    verifier runs llama.cpp's flash attention (other attention kernels; only when on)."""
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
        "n_ubatch": n_ubatch or n_batch,
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
    if sizes != COST_SIZES:
        key["sizes"] = sizes
    if deterministic:
        key["deterministic"] = True
    if flash_attention:
        key["flash_attention"] = True
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

    def check_plausible(self) -> None:
        """Raises ``Implausible`` unless the costs, taken together, are ones a
        measurement gives (module constants: absolute bounds, and every batch against the
        one-token cost)."""
        if len(self.raw) + len(self.padded) > MAX_SHAPES:
            raise Implausible(f"{len(self.raw) + len(self.padded)} batch shapes")
        one = self.raw.get(1)
        if one is None:
            raise Implausible("no one-token cost")
        shapes = [(f"batch {k}", k, v) for k, v in self.raw.items()]
        shapes += [(f"batch {j} with {k} logits", j, v) for (k, j), v in self.padded.items()]
        for name, size, v in shapes:
            if size > MAX_BATCH:
                raise Implausible(f"{name}: above {MAX_BATCH} tokens")
            if not MIN_SECONDS <= v <= MAX_SECONDS:
                raise Implausible(f"{name}: {v!r} s is outside [{MIN_SECONDS}, {MAX_SECONDS}]")
            if not MIN_RATIO <= v / one <= MAX_RATIO_PER_TOKEN * size:
                raise Implausible(f"{name}: {v!r} s against {one!r} s for one token")
        d = self.draft_seconds_per_token
        if d is not None and not MIN_SECONDS / 10 <= d <= MAX_SECONDS:
            raise Implausible(f"draft model: {d!r} s per token")


class Implausible(ValueError):
    """Stored costs that parse but that no measurement of a working machine gives."""


class NotRegular(OSError):
    """A data dir file that is a symbolic link, a FIFO or anything but a regular file."""


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, opened without following a symbolic link and without
    blocking on a FIFO; raises ``NotRegular`` for anything but a regular file, and
    ``OSError`` (EFBIG) for one over ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegular(f"{path} is a symbolic link; the daemon follows none in its "
                             "data dir") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(f"{path} is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, limit + 1 - size):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OSError(errno.EFBIG, f"above {limit} bytes")
    finally:
        os.close(fd)
    return b"".join(chunks)


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
            blob = read_regular(self.path, MAX_FILE_BYTES)  # json.loads decodes it
        except FileNotFoundError:
            return None, "none stored"
        except NotRegular as exc:
            return None, f"refused ({exc})"
        except OSError as exc:
            return None, f"unreadable ({exc.strerror or exc})"
        try:
            data = json.loads(blob)
            if not isinstance(data, dict):
                raise ValueError("not an object")
            # JSON round trip: the key as stored compares equal to a fresh one
            key = json.loads(json.dumps(self.key))
            if data.get("key") != key:
                return None, f"measured under other settings ({_differences(data.get('key'), key)})"
            costs = StoredCosts.from_json(data["costs"])
            costs.check_plausible()
            return costs, "stored"
        except Implausible as exc:
            return None, f"implausible ({exc})"
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError,
                RecursionError) as exc:
            return None, f"corrupt ({type(exc).__name__}: {exc})"

    def save(self, costs: StoredCosts) -> None:
        """Write atomically (a reader sees the old file or the new one, whole) and
        owner-only, like everything in the data dir."""
        body = json.dumps({"key": self.key, "costs": costs.to_json(),
                           "measured_at": time.time()}, indent=1)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        # A leftover of a crash goes first: O_EXCL | O_NOFOLLOW then creates the file
        # itself, 0600, never writing through a link or into a file of another mode.
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            try:
                os.fchmod(fd, 0o600)  # against a umask that takes bits O_CREAT asked for
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
