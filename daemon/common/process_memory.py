"""Where the daemon's resident memory is: its RSS split into parts that add up to it.

Measured from ``/proc/self/smaps`` (Linux) and glibc's ``mallinfo2`` (through ctypes);
elsewhere each figure it cannot read is 0 and what is left shows as ``unattributed``.

The parts (bytes resident), in the order they are attributed:

* ``model_weights``: the GGUF files mapped (the model's weights; file-backed pages the
  kernel may drop and read again, but resident while they are in use);
* ``store``: the LMDB store's file mapped (``data.mdb``: the pages read or written
  lately; file-backed, so the kernel takes them back under pressure, but resident until
  then, and more of them as the store grows);
* ``libraries``: every other file-backed page (the interpreter, shared libraries);
* ``llama_context``: llama.cpp's context buffers (KV cache, compute and output buffers,
  weights repacked into buffers of their own), as llama.cpp sized them when it made them
  (daemon/model/llama_log.py reads them off its log; the caller passes them). Those are
  malloc'd blocks (glibc maps each on its own: ``hblkhd``) whose pages become resident
  as llama.cpp first writes them, so the figure is their resident part where the caller
  can tell it (``KnownParts.llama_context_resident``), else their size;
* ``prompt_cache``: the prompt checkpoints' bytes (daemon/generation/prompt_cache.py);
* ``trees``: the suffix trees' bytes as the native trees count them (Engine.memory():
  their vectors' capacity, of which the last doubling may not be written yet, so a part
  of it may not be resident: ``unattributed`` then goes below 0 by that much);
* ``malloc_in_use``: every other block glibc's malloc has handed out and not had back
  (``uordblks`` + ``hblkhd`` less the three above): Python's objects over 512 bytes,
  numpy arrays, gRPC's buffers, LMDB's and the tokenizer's allocations;
* ``malloc_free``: memory glibc's arenas hold resident although nothing uses it: the
  arenas' resident pages (``[heap]`` and each thread arena's heaps, found in smaps)
  less the blocks in use in them (``uordblks``). This is what grows when many threads
  allocate and free (fragmentation across arenas); ``malloc_trim`` gives it back;
* ``stacks``: the resident pages of thread stacks (the main one and every thread's,
  found in smaps by their guard page);
* ``unattributed``: what is left: mostly Python's small objects (pymalloc's 1 MiB
  arenas, mapped outside malloc), and the error of the estimates above: a part counted
  at its allocated size whose pages are not all written yet (the trees' capacity, a
  block malloc mapped on its own and zero-filled by the kernel) makes it negative. Soaks
  measured it between -30 and +0 MiB (BENCHMARKS.md).

Why smaps and not only mallinfo: ``fordblks`` counts free memory that ``malloc_trim``
already returned to the kernel (``MADV_DONTNEED``), so it over-states what the arenas
hold; the arenas' resident pages are what RSS sees.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import re
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# glibc's thread arenas live in heaps of HEAP_MAX_SIZE (2 x DEFAULT_MMAP_THRESHOLD_MAX:
# 64 MiB on 64-bit), each mapped at an address aligned to that size, its used part
# read-write and the rest PROT_NONE ("---p") until the heap grows into it.
HEAP_MAX = 64 << 20
# A thread stack's guard: PROT_NONE pages just below the stack (glibc: one page by
# default; some runtimes ask for more). Larger ---p regions are not guards.
MAX_GUARD = 64 << 10
MODEL_SUFFIXES = (".gguf",)
STORE_SUFFIXES = ("/data.mdb", "/lock.mdb")  # LMDB's files (suffixcache/store.py)

PARTS = ("model_weights", "store", "libraries", "llama_context", "prompt_cache", "trees",
         "malloc_in_use", "malloc_free", "stacks", "unattributed")

_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+(?:\s+(.*))?$")


@dataclass
class Mapping:
    """One line of /proc/PID/maps with its resident size from smaps (bytes)."""

    start: int
    end: int
    perms: str
    path: str
    rss: int = 0
    anon_rss: int = 0  # "Anonymous:" (private pages written, or never file-backed)

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def file_backed(self) -> bool:
        # "[heap]", "[stack]", "[vvar]", "[anon:...]" and "" are not files; "(deleted)"
        # files still are (their pages stay until unmapped)
        return self.path.startswith("/")


def parse_smaps(text: str) -> list[Mapping]:
    """The mappings of a ``/proc/PID/smaps`` text (sizes in bytes)."""
    out: list[Mapping] = []
    cur: Mapping | None = None
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            cur = Mapping(int(m[1], 16), int(m[2], 16), m[3], (m[4] or "").strip())
            out.append(cur)
            continue
        if cur is None:
            continue
        if line.startswith("Rss:"):
            cur.rss = _kib(line)
        elif line.startswith("Anonymous:"):
            cur.anon_rss = _kib(line)
    return out


def _kib(line: str) -> int:
    parts = line.split()
    try:
        return int(parts[1]) * 1024
    except (IndexError, ValueError):
        return 0


@dataclass
class SmapsSummary:
    """The resident bytes of the mappings by what they are."""

    rss: int = 0
    model_weights: int = 0
    store: int = 0  # LMDB's files
    libraries: int = 0  # every other file-backed resident page
    anonymous: int = 0  # rss - the file-backed pages
    malloc_arenas: int = 0  # [heap] and the thread arenas' heaps
    stacks: int = 0
    model_files: list[str] = field(default_factory=list)


def summarize(maps: list[Mapping], model_suffixes: Iterable[str] = MODEL_SUFFIXES,
              store_suffixes: Iterable[str] = STORE_SUFFIXES) -> SmapsSummary:
    """Resident bytes by kind: model files, the store, other files, malloc arenas, stacks."""
    suffixes = tuple(model_suffixes)
    store = tuple(store_suffixes)
    out = SmapsSummary()
    maps = sorted(maps, key=lambda m: m.start)
    arenas = _arena_indices(maps)
    for i, m in enumerate(maps):
        out.rss += m.rss
        if m.file_backed:
            # a private file mapping written to (relocations, .data) counts as the file's
            if m.path.endswith(suffixes):
                out.model_weights += m.rss
                if m.path not in out.model_files:
                    out.model_files.append(m.path)
            elif m.path.endswith(store):
                out.store += m.rss
            else:
                out.libraries += m.rss
            continue
        out.anonymous += m.rss
        if m.path == "[heap]" or i in arenas:
            out.malloc_arenas += m.rss
        elif m.path == "[stack]" or _is_thread_stack(maps, i):
            out.stacks += m.rss
    return out


def _arena_indices(maps: list[Mapping]) -> set[int]:
    """The read-write anonymous mappings that are glibc thread-arena heaps: the used part
    of a HEAP_MAX-aligned reservation whose rest is PROT_NONE (the next mapping, ending
    at the reservation's end), or a whole reservation grown to its full size."""
    out: set[int] = set()
    for i, m in enumerate(maps):
        if m.path or not m.perms.startswith("rw"):
            continue
        if m.start % HEAP_MAX == 0 and m.size % HEAP_MAX == 0:
            out.add(i)  # full heaps (the kernel merges adjacent ones)
            continue
        nxt = maps[i + 1] if i + 1 < len(maps) else None
        if (nxt is not None and not nxt.path and nxt.perms.startswith("---")
                and nxt.start == m.end and nxt.end % HEAP_MAX == 0
                and m.start <= nxt.end - HEAP_MAX < m.end):
            # the reservation [nxt.end - HEAP_MAX, nxt.end) begins inside m (at its start,
            # or past it when the kernel merged m with the mapping just below)
            out.add(i)
    return out


def _is_thread_stack(maps: list[Mapping], i: int) -> bool:
    """A read-write anonymous mapping right above a small PROT_NONE guard."""
    m = maps[i]
    if m.path or not m.perms.startswith("rw") or i == 0:
        return False
    prev = maps[i - 1]
    return (not prev.path and prev.perms.startswith("---") and prev.end == m.start
            and prev.size <= MAX_GUARD)


def parse_maps_ranges(text: str, anonymous: bool = True) -> list[tuple[int, int]]:
    """The [start, end) ranges of a ``/proc/PID/maps`` text, sorted; only the mappings
    of no file (anonymous, ``[heap]`` and the like) when ``anonymous``."""
    out: list[tuple[int, int]] = []
    for line in text.splitlines():
        m = _HEADER.match(line)
        if m and not (anonymous and (m[4] or "").startswith("/")):
            out.append((int(m[1], 16), int(m[2], 16)))
    out.sort()
    return out


def anonymous_ranges() -> list[tuple[int, int]] | None:
    """This process's anonymous mappings now (``parse_maps_ranges``), or None."""
    try:
        return parse_maps_ranges(Path("/proc/self/maps").read_text(errors="replace"))
    except OSError:
        return None


_PAGE = mmap.PAGESIZE
_LOW_BIT = bytes(i & 1 for i in range(256))  # mincore: bit 0 of each byte is "resident"


def resident_in(ranges: Iterable[tuple[int, int]]) -> int | None:
    """The resident bytes of this process's pages in ``ranges`` (page-aligned,
    [start, end)), by ``mincore``; None where it fails (a range no longer mapped: ENOMEM)
    or there is no glibc."""
    lib = _glibc()
    if lib is None:
        return None
    total = 0
    for start, end in ranges:
        if end <= start:
            continue
        n = (end - start + _PAGE - 1) // _PAGE
        vec = (ctypes.c_ubyte * n)()
        if lib.mincore(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vec) != 0:
            return None
        total += bytes(vec).translate(_LOW_BIT).count(1) * _PAGE
    return total


# ------------------------------------------------------------------------- glibc malloc


class _Mallinfo2(ctypes.Structure):
    # struct mallinfo2 (glibc >= 2.33): every field a size_t
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


@dataclass
class MallocInfo:
    """glibc's ``mallinfo2``, over every arena (bytes, but the two block counts)."""

    arena: int  # bytes the arenas took from the system (brk and thread heaps)
    ordblks: int  # free chunks
    hblks: int  # blocks mapped on their own (mmap)
    hblkhd: int  # bytes in those
    uordblks: int  # bytes in use in the arenas
    fordblks: int  # bytes free in the arenas (resident or given back)
    keepcost: int  # the top chunk's free bytes (what trimming can release at the end)


_libc: Any = None
_libc_lock = threading.Lock()


def _glibc() -> Any:
    """The C library when it is glibc with mallinfo2 (else None); loaded once."""
    global _libc
    with _libc_lock:
        if _libc is None:
            _libc = False
            if sys.platform.startswith("linux"):
                with contextlib.suppress(OSError):
                    lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                    if hasattr(lib, "mallinfo2") and hasattr(lib, "malloc_trim"):
                        lib.mallinfo2.restype = _Mallinfo2
                        lib.mallinfo2.argtypes = []
                        lib.malloc_trim.restype = ctypes.c_int
                        lib.malloc_trim.argtypes = [ctypes.c_size_t]
                        lib.mallopt.restype = ctypes.c_int
                        lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
                        lib.mincore.restype = ctypes.c_int
                        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                                ctypes.POINTER(ctypes.c_ubyte)]
                        _libc = lib
        return _libc or None


def mallinfo() -> MallocInfo | None:
    """glibc's figures, or None (another C library, another system)."""
    lib = _glibc()
    if lib is None:
        return None
    mi = lib.mallinfo2()
    return MallocInfo(arena=mi.arena, ordblks=mi.ordblks, hblks=mi.hblks, hblkhd=mi.hblkhd,
                      uordblks=mi.uordblks, fordblks=mi.fordblks, keepcost=mi.keepcost)


def malloc_trim() -> bool:
    """Give the arenas' free pages back to the kernel (glibc's ``malloc_trim(0)``: the
    top of each arena, and since glibc 2.8 every whole free page inside them, by
    ``MADV_DONTNEED``). False where there is no glibc, or nothing was released."""
    lib = _glibc()
    return bool(lib.malloc_trim(0)) if lib is not None else False


# mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8


def mallopt(param: int, value: int) -> bool:
    """glibc's ``mallopt``; False where it is not glibc or the value was refused."""
    lib = _glibc()
    return bool(lib.mallopt(param, value)) if lib is not None else False


# ------------------------------------------------------------------------- the breakdown


@dataclass
class KnownParts:
    """What the daemon knows it holds in malloc'd memory (bytes)."""

    llama_context: int = 0  # llama.cpp's buffers, as sized (allocated)
    llama_context_resident: int | None = None  # their resident part, when known
    prompt_cache: int = 0
    trees: int = 0


def breakdown(smaps: SmapsSummary | None, malloc: MallocInfo | None, known: KnownParts,
              rss: int | None = None) -> dict[str, Any]:
    """The parts of RSS (``PARTS``, bytes) from what was measured and what is known.

    ``rss``: the process's RSS when smaps could not be read (e.g. VmRSS); the parts then
    are the known ones and the rest unattributed."""
    s = smaps or SmapsSummary(rss=rss or 0, anonymous=rss or 0)
    total = s.rss
    llama = known.llama_context if known.llama_context_resident is None else min(
        known.llama_context, known.llama_context_resident)
    parts = dict.fromkeys(PARTS, 0)
    parts.update(model_weights=s.model_weights, store=s.store, libraries=s.libraries,
                 llama_context=llama,
                 prompt_cache=known.prompt_cache, trees=known.trees, stacks=s.stacks)
    if malloc is not None:
        in_use = malloc.uordblks + malloc.hblkhd
        # The known parts are inside malloc's blocks: what is left of them is the rest of
        # the program's. (llama.cpp's buffers count at their allocated size there.)
        parts["malloc_in_use"] = max(
            0, in_use - known.llama_context - known.prompt_cache - known.trees)
        if smaps is not None:
            parts["malloc_free"] = max(0, s.malloc_arenas - malloc.uordblks)
    parts["unattributed"] = total - sum(v for k, v in parts.items() if k != "unattributed")
    out: dict[str, Any] = {"rss": total, "parts": parts}
    if malloc is not None:
        out["malloc"] = asdict(malloc)
    if smaps is not None:
        out["smaps"] = {"anonymous": s.anonymous, "malloc_arenas": s.malloc_arenas,
                        "model_files": s.model_files}
    out["llama_context_allocated"] = known.llama_context
    return out


def read_smaps(pid: str = "self") -> list[Mapping] | None:
    """This process's mappings, or None where /proc/PID/smaps cannot be read."""
    try:
        text = Path(f"/proc/{pid}/smaps").read_text(errors="replace")
    except OSError:
        return None
    return parse_smaps(text)


def vm_rss(pid: str = "self") -> int | None:
    """VmRSS from /proc/PID/status (bytes), or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return _kib(line)
    except OSError:
        pass
    return None


def _max_rss() -> int | None:
    """The peak RSS where /proc is missing (getrusage: KiB on Linux, bytes on macOS)."""
    try:
        import resource
    except ImportError:
        return None
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024


def measure(known: KnownParts, model_suffixes: Iterable[str] = MODEL_SUFFIXES,
            ) -> dict[str, Any]:
    """The breakdown of this process now (``breakdown``), with ``"source"`` saying what
    could be read: "smaps", "status" (VmRSS only), or "rusage" (the peak only)."""
    maps = read_smaps()
    malloc = mallinfo()
    if maps is not None:
        out = breakdown(summarize(maps, model_suffixes), malloc, known)
        out["source"] = "smaps"
        return out
    rss = vm_rss()
    source = "status"
    if rss is None:
        rss, source = _max_rss() or 0, "rusage"
    out = breakdown(None, malloc, known, rss=rss)
    out["source"] = source
    return out


class Sampler:
    """``measure`` at most every ``min_interval_s``: reading smaps walks the page tables
    (milliseconds for a GiB), and Stats may be asked many times a second."""

    def __init__(self, min_interval_s: float = 1.0) -> None:
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._last: tuple[float, dict[str, Any]] | None = None

    def sample(self, known: Any) -> dict[str, Any]:
        """``known``: a KnownParts, or a function returning one (called only when a new
        measurement is taken)."""
        with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._last[0] < self.min_interval_s:
                return self._last[1]
            parts = known() if callable(known) else known
            out = measure(parts)
            out["time"] = time.time()
            self._last = (now, out)
            return out
