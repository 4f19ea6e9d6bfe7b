"""The daemon's process memory by part (issue 44, item 9): smaps and mallinfo parsed and
attributed (daemon/common/process_memory.py), llama.cpp's buffers read off its log
(daemon/model/llama_buffers.py), the parts in ``suffixd stats`` and Prometheus; and the
soak's flatness rule (bench/rss_watch.py)."""

from __future__ import annotations

import ctypes
import importlib.util
import mmap
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from suffixd.cli.stats import process_memory_lines, render_table
from suffixd.daemon.common import process_memory as pm
from suffixd.daemon.model import llama_buffers as lb
from suffixd.daemon.server import malloc_tuning as mt

MIB = 1 << 20
HEAP = pm.HEAP_MAX


def _vma(start: int, end: int, perms: str, path: str = "", rss_kib: int = 0) -> str:
    head = f"{start:x}-{end:x} {perms} 00000000 00:00 0"
    head += f"                          {path}" if path else ""
    return (f"{head}\nSize:           {(end - start) >> 10} kB\nKernelPageSize:        4 kB\n"
            f"Rss:            {rss_kib} kB\nPss:            {rss_kib} kB\n"
            f"Anonymous:      {0 if path.startswith('/') else rss_kib} kB\n"
            "VmFlags: rd wr mr mw me ac\n")


BASE = 0x7F00_0000_0000  # HEAP_MAX-aligned
SMAPS = "".join([
    _vma(0x5600_0000_0000, 0x5600_0010_0000, "r-xp", "/usr/bin/python3.11", 900),
    _vma(0x5600_0100_0000, 0x5600_0300_0000, "rw-p", "[heap]", 20 * 1024),
    # a thread arena's heap: 3 MiB used (2 resident), the rest of its 64 MiB PROT_NONE
    _vma(BASE, BASE + 3 * MIB, "rw-p", "", 2 * 1024),
    _vma(BASE + 3 * MIB, BASE + HEAP, "---p"),
    # a heap grown to its full size, right after
    _vma(BASE + HEAP, BASE + 2 * HEAP, "rw-p", "", 30 * 1024),
    # the kernel merged the next heap's used part with an anonymous mapping below it
    _vma(BASE + 2 * HEAP + 60 * MIB, BASE + 3 * HEAP + MIB, "rw-p", "", 5 * 1024),
    _vma(BASE + 3 * HEAP + MIB, BASE + 4 * HEAP, "---p"),
    # a thread stack above its one-page guard
    _vma(BASE + 5 * HEAP, BASE + 5 * HEAP + 4096, "---p"),
    _vma(BASE + 5 * HEAP + 4096, BASE + 5 * HEAP + 8 * MIB, "rw-p", "", 64),
    # a large PROT_NONE reservation is no guard: what is above it is no stack
    _vma(BASE + 6 * HEAP, BASE + 6 * HEAP + 2 * MIB, "---p"),
    _vma(BASE + 6 * HEAP + 2 * MIB, BASE + 6 * HEAP + 100 * MIB, "rw-p", "", 40 * 1024),
    # the model, mapped twice (read-only and a private view): both count as its weights
    _vma(BASE + 8 * HEAP, BASE + 8 * HEAP + 240 * MIB, "r--s", "/m/gemma-3.gguf", 235 * 1024),
    _vma(BASE + 9 * HEAP, BASE + 9 * HEAP + MIB, "r--p", "/m/gemma-3.gguf", 100),
    _vma(BASE + 10 * HEAP, BASE + 10 * HEAP + 2 * MIB, "r-xp", "/usr/lib/libc.so.6 (deleted)",
         1200),
    _vma(BASE + 11 * HEAP, BASE + 12 * HEAP, "rw-s", "/d/store/data.mdb", 3 * 1024),
    _vma(0x7FFC_0000_0000, 0x7FFC_0002_1000, "rw-p", "[stack]", 132),
    _vma(0x7FFC_0003_0000, 0x7FFC_0003_2000, "r--p", "[vvar]", 0),
])


def test_smaps_summary_attributes_each_mapping() -> None:
    maps = pm.parse_smaps(SMAPS)
    assert len(maps) == 17
    assert maps[1].path == "[heap]" and maps[1].rss == 20 * MIB
    assert maps[-4].path == "/usr/lib/libc.so.6 (deleted)"
    s = pm.summarize(maps)
    assert s.rss == sum(m.rss for m in maps)
    assert s.model_weights == 235 * MIB + 100 * 1024
    assert s.model_files == ["/m/gemma-3.gguf"]
    assert s.libraries == (900 + 1200) * 1024
    assert s.store == 3 * MIB
    assert s.anonymous == s.rss - s.model_weights - s.libraries - s.store
    # [heap], the arena heap, the full heap and the merged one; not the stack nor the
    # mapping above the large reservation
    assert s.malloc_arenas == (20 + 2 + 30 + 5) * MIB
    assert s.stacks == (64 + 132) * 1024


def test_breakdown_adds_up_to_rss() -> None:
    s = pm.summarize(pm.parse_smaps(SMAPS))
    malloc = pm.MallocInfo(arena=60 * MIB, ordblks=10, hblks=3, hblkhd=700 * MIB,
                           uordblks=50 * MIB, fordblks=10 * MIB, keepcost=0)
    known = pm.KnownParts(llama_context=680 * MIB, llama_context_resident=30 * MIB,
                          prompt_cache=12 * MIB, trees=3 * MIB)
    out = pm.breakdown(s, malloc, known)
    p = out["parts"]
    assert tuple(p) == pm.PARTS
    assert sum(p.values()) == out["rss"] == s.rss
    assert p["llama_context"] == 30 * MIB  # its resident part, not its size
    assert p["malloc_in_use"] == (50 + 700 - 680 - 12 - 3) * MIB
    assert p["malloc_free"] == (57 - 50) * MIB  # the arenas' resident pages less in use
    assert out["malloc"]["hblkhd"] == 700 * MIB
    assert out["llama_context_allocated"] == 680 * MIB
    # without a resident figure the buffers count at their size
    out = pm.breakdown(s, malloc, pm.KnownParts(llama_context=20 * MIB))
    assert out["parts"]["llama_context"] == 20 * MIB


def test_breakdown_without_mallinfo_or_smaps() -> None:
    s = pm.summarize(pm.parse_smaps(SMAPS))
    out = pm.breakdown(s, None, pm.KnownParts(prompt_cache=5 * MIB))
    assert out["parts"]["malloc_in_use"] == out["parts"]["malloc_free"] == 0
    assert "malloc" not in out
    assert sum(out["parts"].values()) == s.rss
    # nothing but an RSS: the known parts, the rest unattributed
    out = pm.breakdown(None, None, pm.KnownParts(trees=MIB), rss=100 * MIB)
    assert out["rss"] == 100 * MIB
    assert out["parts"]["trees"] == MIB and out["parts"]["unattributed"] == 99 * MIB
    assert "smaps" not in out


def test_no_glibc_degrades(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pm, "_glibc", lambda: None)
    assert pm.mallinfo() is None
    assert pm.malloc_trim() is False
    assert pm.mallopt(pm.M_ARENA_MAX, 2) is False
    assert pm.resident_in([(0, 4096)]) is None
    out = pm.measure(pm.KnownParts())
    assert "malloc" not in out and out["parts"]["malloc_in_use"] == 0
    # and without /proc: the peak RSS from getrusage
    monkeypatch.setattr(pm, "read_smaps", lambda pid="self": None)
    monkeypatch.setattr(pm, "vm_rss", lambda pid="self": None)
    out = pm.measure(pm.KnownParts())
    assert out["source"] == "rusage" and out["rss"] > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc and glibc")
def test_measure_this_process() -> None:
    out = pm.measure(pm.KnownParts())
    assert out["source"] == "smaps"
    assert sum(out["parts"].values()) == out["rss"]
    vm = pm.vm_rss()
    assert vm is not None and abs(out["rss"] - vm) < 0.2 * vm
    if pm.mallinfo() is not None:  # glibc
        assert out["parts"]["malloc_in_use"] > 0 and out["smaps"]["malloc_arenas"] > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore on Linux")
def test_resident_in_counts_written_pages() -> None:
    if pm.mallinfo() is None:
        pytest.skip("no glibc")
    page = mmap.PAGESIZE
    m = mmap.mmap(-1, 64 * page)
    try:
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        for i in range(0, 40 * page, page):  # the first 40 pages written
            m[i] = 1
        got = pm.resident_in([(addr, addr + 64 * page)])
        assert got == 40 * page
        assert pm.resident_in([(addr, addr + 8 * page)]) == 8 * page
    finally:
        import gc

        gc.collect()  # the ctypes view must go before the mapping closes
        m.close()


def test_maps_ranges_and_their_difference() -> None:
    text = ("00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/dbus-daemon\n"
            "00e03000-00e24000 rw-p 00000000 00:00 0 [heap]\n"
            "7f0000000000-7f0000100000 rw-p 00000000 00:00 0\n")
    assert pm.parse_maps_ranges(text) == [(0xE03000, 0xE24000),
                                          (0x7F0000000000, 0x7F0000100000)]
    assert len(pm.parse_maps_ranges(text, anonymous=False)) == 3
    before = [(10, 20), (40, 50)]
    after = [(0, 25), (30, 60)]
    assert lb._subtract(after, before) == [(0, 10), (20, 25), (30, 40), (50, 60)]
    assert lb._subtract([(10, 20)], [(10, 20)]) == []
    assert lb._subtract([(10, 20)], []) == [(10, 20)]


LOG = """llama_context: constructing llama_context
llama_context: n_seq_max             = 4
llama_context:        CPU  output buffer size =     4.00 MiB
llama_kv_cache:        CPU KV buffer size =    96.00 MiB
llama_kv_cache:        CPU KV buffer size =    60.00 MiB
sched_reserve:        CPU compute buffer size =   514.50 MiB"""


def test_llama_buffers_from_the_log(monkeypatch: pytest.MonkeyPatch) -> None:
    snapshots = iter([[(0, 4096)], [(0, 4096), (8192, 16384)]])  # before, after
    monkeypatch.setattr(lb, "anonymous_ranges", lambda: next(snapshots))
    monkeypatch.setattr(lb, "resident_in", lambda ranges: sum(b - a for a, b in ranges))
    buffers = lb.LlamaBuffers()
    buffers.observe("load_tensors:   CPU_Mapped model buffer size =   240.00 MiB")
    buffers.observe("load_tensors:   CPU_REPACK model buffer size =    12.00 MiB")
    for line in LOG.splitlines():
        buffers.observe(line)
    assert buffers.allocated() == {"output": 4 * MIB, "KV": 156 * MIB,
                                   "compute": int(514.5 * MIB), "model": 12 * MIB}
    # the context's new pages (8 KiB here) and the repacked weights at their size
    assert buffers.resident() == 8192 + 12 * MIB
    buffers.observe("~llama_context:        CPU compute buffer size is 514.5020 MiB, "
                    "matches expectation of 514.5020 MiB")
    assert buffers.allocated() == {"model": 12 * MIB}
    assert buffers.resident() == 12 * MIB


def test_llama_buffers_unknown_residency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lb, "anonymous_ranges", lambda: None)  # no /proc
    buffers = lb.LlamaBuffers()
    for line in LOG.splitlines():
        buffers.observe(line)
    assert buffers.resident() is None
    assert sum(buffers.allocated().values()) == int((4 + 156 + 514.5) * MIB)


def _report(parts: dict[str, int]) -> dict[str, Any]:
    return {"rss": sum(parts.values()), "parts": parts, "source": "smaps",
            "llama_buffers": {"KV": 156 * MIB, "compute": 514 * MIB},
            "llama_context_allocated": 670 * MIB}


def test_stats_renders_the_process_memory() -> None:
    parts = dict.fromkeys(pm.PARTS, 0) | {"model_weights": 235 * MIB, "prompt_cache": 30 * MIB,
                                          "llama_context": 200 * MIB, "unattributed": -2 * MIB}
    lines = process_memory_lines(_report(parts))
    text = "\n".join(lines)
    assert lines[0] == "process memory: RSS 463 MiB"
    assert "  model weights             235 MiB" in text
    assert "llama.cpp context         200 MiB   resident, of 670 allocated: KV 156, compute 514" \
        in text
    assert "unattributed               -2 MiB" in text
    assert process_memory_lines(None) == [] and process_memory_lines({}) == []
    table = render_table({"namespaces": [], "memory": [], "process_memory": _report(parts)})
    assert "process memory: RSS 463 MiB" in table
    assert "(from status" in "\n".join(process_memory_lines({**_report(parts),
                                                             "source": "status"}))
    trimmed = process_memory_lines({**_report(parts), "malloc_trim": {
        "interval_s": 30.0, "trims": 12, "seconds": 0.0421}})
    assert any(line.startswith("  malloc free held") and line.endswith(
        "; trimmed every 30 s (12 times, 42 ms in all)") for line in trimmed)


def test_prometheus_gauges_by_part(monkeypatch: pytest.MonkeyPatch) -> None:
    from suffixd.daemon.server import metrics

    parts = dict.fromkeys(pm.PARTS, MIB)
    monkeypatch.setattr(metrics, "process_memory", lambda engine: {
        **_report(parts), "malloc": {"uordblks": 1, "fordblks": 2, "hblkhd": 3, "arena": 4}})
    engine = SimpleNamespace(stats=lambda top_documents=1: {}, memory=lambda: [])
    fams = {f.name: f for f in metrics.EngineCollector(engine).collect()}
    got = {s.labels["part"]: s.value for s in fams["suffixd_process_memory_bytes"].samples}
    assert got == {p: MIB for p in pm.PARTS}
    assert fams["suffixd_process_resident_bytes"].samples[0].value == len(pm.PARTS) * MIB
    malloc = {s.labels["kind"]: s.value for s in fams["suffixd_malloc_bytes"].samples}
    assert malloc == {"in_use": 1, "free": 2, "mmapped": 3, "arenas": 4}
    llama = {s.labels["kind"]: s.value for s in fams["suffixd_llama_buffer_bytes"].samples}
    assert llama == {"KV": 156 * MIB, "compute": 514 * MIB}


def _rss_watch() -> Any:
    path = Path(__file__).resolve().parents[1] / "bench" / "rss_watch.py"
    spec = importlib.util.spec_from_file_location("rss_watch", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_soak_flatness_rule() -> None:
    rw = _rss_watch()

    def samples(f: Any, pid: Any = lambda t: 1) -> list[dict[str, Any]]:
        return [{"t": t, "pid": pid(t), "rss": f(t), "vm_rss": f(t),
                 "parts": dict.fromkeys(rw.PART_NAMES, 0.0) | {"prompt_cache": f(t) - 900}}
                for t in range(0, 3601, 30)]

    # +-40 MiB of allocator noise around 1,000 MiB: flat
    v = rw.flat(samples(lambda t: 1000 + (40 if (t // 30) % 2 else -40)), 3600, 1200)
    assert v["flat"] is True and abs(v["growth_mib"]) < 16 and v["samples"] == 41
    # 1.5 MiB a minute for the last 20 minutes: 30 MiB, over max(16, 2% of ~1,015)
    v = rw.flat(samples(lambda t: 1000 + max(0, t - 2400) / 40), 3600, 1200)
    assert v["flat"] is False and v["growth_mib"] == pytest.approx(30, abs=0.5)
    assert v["limit_mib"] == pytest.approx(20.3, abs=0.1)
    assert v["growth_by_part_mib"]["prompt_cache"] == pytest.approx(30, abs=0.5)
    # growth before the window does not count
    assert rw.flat(samples(lambda t: 500 + min(t, 2000) / 4), 3600, 1200)["flat"] is True
    # a restart inside the window cannot be judged
    v = rw.flat(samples(lambda t: 1000, pid=lambda t: 1 if t < 3000 else 2), 3600, 1200)
    assert v["flat"] is None and "restarted" in v["why"]
    assert rw.flat([], 3600, 1200)["flat"] is None
    md = rw.markdown({"command": "soak.py", "seconds": 3600, "interval_s": 30,
                      "verdicts": {"a": rw.flat(samples(lambda t: 1000), 3600, 1200)},
                      "samples": {"a": samples(lambda t: 1000)[:2]}})
    assert "node a: **flat** over the last 20 min" in md
    assert "| 0.5 | 1 | 1000 |" in md


def test_suffixd_stats_shows_the_process_memory(daemon: Any) -> None:
    """A real daemon: `suffixd stats` prints the process memory section, its parts add up
    to the daemon's RSS, and once the model is loaded llama.cpp's buffers are in it."""
    import json

    from click.testing import CliRunner
    from suffixd.cli.stats import stats

    sock = daemon.proc.socket.removeprefix("unix:")
    pid = daemon.proc.proc.pid

    def report() -> dict[str, Any]:
        res = CliRunner().invoke(stats, ["--socket", sock, "--json"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        out: dict[str, Any] = json.loads(res.output)["process_memory"]
        return out

    res = CliRunner().invoke(stats, ["--socket", sock], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "process memory: RSS " in res.output
    for name in ("model weights", "store", "llama.cpp context", "prompt cache", "suffix trees",
                 "malloc in use", "malloc free held", "thread stacks", "unattributed"):
        assert f"\n  {name} " in res.output, name
    pm0 = report()
    assert sum(pm0["parts"].values()) == pm0["rss"]
    vm = pm.vm_rss(str(pid))
    assert vm is not None and abs(pm0["rss"] - vm) < 0.3 * vm
    assert pm0["parts"]["llama_context"] == 0 and pm0["parts"]["model_weights"] == 0
    assert pm0["malloc_trim"]["interval_s"] == mt.DEFAULT_TRIM_S  # the trimmer runs (malloc_tuning)

    list(daemon.generate(None, prompt="Hello", max_tokens=2))  # loads the model
    import time

    time.sleep(1.1)  # the daemon measures at most once a second
    pm1 = report()
    assert sum(pm1["parts"].values()) == pm1["rss"]
    assert {"KV", "compute"} <= set(pm1["llama_buffers"])
    assert 0 < pm1["parts"]["llama_context"] <= pm1["llama_context_allocated"]
    # the KV cache is cleared when made: all of it resident
    assert pm1["parts"]["llama_context"] >= pm1["llama_buffers"]["KV"]
    assert pm1["parts"]["model_weights"] > 100 * MIB  # the embedded gemma-3-270m, mapped
    assert pm1["smaps"]["model_files"][0].endswith(".gguf")


def test_malloc_tuning(monkeypatch: pytest.MonkeyPatch) -> None:


    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(mt, "mallopt", lambda param, value: calls.append((param, value)) or True)
    for name in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES",
                 "SUFFIXD_MALLOC_ARENA_MAX", "SUFFIXD_MALLOC_MMAP_THRESHOLD_KB"):
        monkeypatch.delenv(name, raising=False)
    assert mt.tune() == {"arena_max": 4, "mmap_threshold": 4 << 20}
    assert calls == [(pm.M_ARENA_MAX, 4), (pm.M_MMAP_THRESHOLD, 4 << 20)]
    # glibc's own settings win; 0 leaves glibc's default
    calls.clear()
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    monkeypatch.setenv("SUFFIXD_MALLOC_MMAP_THRESHOLD_KB", "0")
    assert mt.tune() == {} and calls == []
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert mt.tune() == {}
    monkeypatch.setenv("GLIBC_TUNABLES", "")
    monkeypatch.setenv("SUFFIXD_MALLOC_ARENA_MAX", "two")  # not a number: the default
    assert mt.tune() == {"arena_max": 4}


def test_trimmer_thread_stops_with_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading



    trimmed = threading.Event()
    monkeypatch.setattr(mt, "malloc_trim", lambda: bool(trimmed.set()))
    monkeypatch.setattr(mt, "mallinfo", lambda: object())
    monkeypatch.setenv("SUFFIXD_MALLOC_TRIM_S", "0.01")
    closed: list[bool] = []
    engine = SimpleNamespace(close=lambda: closed.append(True))
    assert mt.register(None, engine) == []
    assert trimmed.wait(5)
    thread = engine.malloc_trimmer._thread
    assert thread.name == "suffixd-malloc-trim" and thread.is_alive()
    engine.close()
    assert closed == [True] and not thread.is_alive()
    assert engine.malloc_trimmer.trims >= 1
    # off: no thread
    monkeypatch.setenv("SUFFIXD_MALLOC_TRIM_S", "0")
    other = SimpleNamespace(close=lambda: None)
    assert mt.register(None, other) == [] and not hasattr(other, "malloc_trimmer")
