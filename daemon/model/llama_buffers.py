"""llama.cpp's buffers in this process, read off its log: how large, and how much resident.

llama-cpp-python exposes no size of a context's buffers (llama.cpp's own breakdown,
``llama_get_memory_breakdown``, is C++ only), but llama.cpp logs each one as it makes it:

    llama_context:        CPU  output buffer size =     4.00 MiB
    llama_kv_cache:        CPU KV buffer size =    96.00 MiB
    sched_reserve:        CPU compute buffer size =   514.50 MiB
    load_tensors:   CPU_REPACK model buffer size =    12.00 MiB

daemon/model/llama_log.py hands every line here (``observe``), whatever the log level.
A context's buffers are malloc'd whole at its construction, but their pages become
resident only as llama.cpp first writes them: the compute buffer (514 MiB for
gemma-3-270m at 512 rows: the logits of a whole batch) fills as larger batches and
longer contexts come, which read as growth for a long while. So the address ranges
mapped between a context's first line ("constructing llama_context") and its last (the
compute buffer's size) are kept, and ``resident()`` counts their resident pages
(``mincore``). A context is forgotten when llama.cpp logs its destruction
("~llama_context: ... compute buffer size is ...").
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

from ..common.process_memory import anonymous_ranges, resident_in

_SIZE = re.compile(r"^(~?\w+):\s+(\S+)\s+(.+?) buffer size (?:=|is)\s+([0-9.]+) MiB")
_CONSTRUCTING = "llama_context: constructing llama_context"


@dataclass
class _Context:
    sizes: dict[str, int] = field(default_factory=dict)  # kind -> bytes
    before: list[tuple[int, int]] | None = None  # anonymous ranges before it was built
    ranges: list[tuple[int, int]] = field(default_factory=list)  # mapped while built
    complete: bool = False

    @property
    def nbytes(self) -> int:
        return sum(self.sizes.values())


class LlamaBuffers:
    """The buffers of every live llama.cpp context and model, from the log lines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._contexts: list[_Context] = []
        self._building: _Context | None = None
        self._model_bytes = 0  # weights copied into buffers of their own (not the mapped file)

    def observe(self, line: str) -> None:
        """One complete line of llama.cpp's log."""
        if line.startswith(_CONSTRUCTING):
            new = _Context(before=anonymous_ranges())
            with self._lock:
                self._building = new
                self._contexts.append(new)
            return
        m = _SIZE.match(line)
        if m is None:
            return
        who, device, kind, mib = m[1], m[2], m[3].strip(), float(m[4])
        nbytes = int(mib * (1 << 20))
        with self._lock:
            if who.startswith("~"):  # a context freed: its compute buffer's size is logged
                self._forget(nbytes)
                return
            if kind == "model":
                # "CPU_Mapped" is the file itself (counted as the model's mapping)
                if not device.endswith("_Mapped"):
                    self._model_bytes += nbytes
                return
            ctx = self._building
            if ctx is None:
                return
            ctx.sizes[kind] = ctx.sizes.get(kind, 0) + nbytes
            # the compute buffers are reserved last ("sched_reserve"; one line per device)
            done = kind == "compute"
        if done:
            after = anonymous_ranges()
            with self._lock:
                ctx.ranges = _subtract(after, ctx.before or []) if after is not None else []
                ctx.before = None
                ctx.complete = True
                if self._building is ctx:
                    self._building = None

    def _forget(self, compute_bytes: int) -> None:
        for i, ctx in enumerate(self._contexts):
            if abs(ctx.sizes.get("compute", -1) - compute_bytes) < (1 << 20):
                del self._contexts[i]
                return

    def allocated(self) -> dict[str, int]:
        """Bytes by kind over every live context ("KV", "compute", "output", ...), and
        "model" for weights held in buffers of their own."""
        out: dict[str, int] = {}
        with self._lock:
            for ctx in self._contexts:
                for kind, n in ctx.sizes.items():
                    out[kind] = out.get(kind, 0) + n
            if self._model_bytes:
                out["model"] = self._model_bytes
        return out

    def resident(self) -> int | None:
        """The resident bytes of the contexts' buffers (at most their sizes), plus the
        weights' buffers at their size; None when it cannot be told (no mincore, a
        context whose ranges were not found)."""
        with self._lock:
            contexts = [(list(c.ranges), c.nbytes, c.complete) for c in self._contexts]
            model = self._model_bytes
        total = model
        for ranges, nbytes, complete in contexts:
            if not complete or not ranges:
                return None
            got = resident_in(ranges)
            if got is None:
                return None
            total += min(got, nbytes)
        return total


def _subtract(after: list[tuple[int, int]], before: list[tuple[int, int]],
              ) -> list[tuple[int, int]]:
    """The parts of the ranges ``after`` not covered by ``before`` (both sorted,
    non-overlapping, [start, end))."""
    out: list[tuple[int, int]] = []
    j = 0
    for start, end in after:
        cur = start
        while j < len(before) and before[j][1] <= cur:
            j += 1
        k = j
        while cur < end:
            if k >= len(before) or before[k][0] >= end:
                out.append((cur, end))
                break
            b0, b1 = before[k]
            if b0 > cur:
                out.append((cur, b0))
            cur = max(cur, b1)
            k += 1
    return out


BUFFERS = LlamaBuffers()
