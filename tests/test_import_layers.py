"""The import structure stays a ladder: no module imports one that imports it back, and
each part of the daemon imports only the parts below it (daemon/__init__.py draws them).

Read from the installed packages by grimp (the same graph import-linter checks), with the
imports under ``if TYPE_CHECKING:`` and inside functions counted: a circle a type
annotation closes is still a circle a reader has to untangle.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

import grimp
import pytest

PACKAGES = ("suffixd.daemon", "suffixd.client", "suffixd.cli", "suffixd.benchkit",
            "suffixcache")

# The daemon's parts, top to bottom. A part imports only parts of lower layers (the
# parts of one layer are independent of each other).
DAEMON_LAYERS: list[set[str]] = [
    {"server"},
    {"grpc_api", "http_api", "fleet"},
    {"generation", "engine"},
    {"model"},
    {"common"},
]

# The repository's layers: cli -> benchkit -> client | daemon -> suffixcache (and the
# generated suffixd.v1 messages, which import nothing of ours). The benchmark library
# (benchkit) is what `suffixd bench` is a thin command line over.
TOP_LAYERS: list[set[str]] = [
    {"suffixd.cli"},
    {"suffixd.benchkit"},
    {"suffixd.client", "suffixd.daemon"},
    {"suffixcache"},
]

# What a part must not import directly: the engine and the library know nothing of gRPC,
# HTTP or llama.cpp (the engine is handed its tokenizer's module through ``model``); the
# benchmark library knows nothing of the command line's click.
FORBIDDEN_EXTERNAL = {
    "suffixcache": {"grpc", "llama_cpp", "starlette", "uvicorn", "redis"},
    "suffixd.daemon.engine": {"grpc", "llama_cpp", "starlette", "uvicorn"},
    "suffixd.daemon.common": {"grpc", "llama_cpp", "starlette", "uvicorn", "redis"},
    "suffixd.cli.corpus": {"grpc", "llama_cpp", "starlette", "uvicorn", "redis"},
    "suffixd.benchkit": {"click"},
}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (or a self-import):
    each is a set of modules that import each other in a circle. Tarjan's algorithm,
    iterative (the graph has hundreds of modules, recursion would do too)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1 or node in edges.get(node, ()):
                    found.append(sorted(component))
    return found


def layer_violations(edges: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    """Every import of a part by a part that is not above it (a sibling, or a lower one)."""
    rank = {part: i for i, layer in enumerate(layers) for part in layer}
    bad = []
    for importer, imported in sorted((a, b) for a, bs in edges.items() for b in bs):
        if importer == imported or importer not in rank or imported not in rank:
            continue
        if rank[imported] <= rank[importer]:
            bad.append(f"{importer} -> {imported}")
    return bad


def part_of(module: str, prefix: str, depth: int = 1) -> str | None:
    """``suffixd.daemon.engine.ingest`` -> ``engine`` under ``suffixd.daemon``."""
    if not module.startswith(prefix + "."):
        return None
    return ".".join(module[len(prefix) + 1:].split(".")[:depth])


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # No cache: the check reads the files as they are now.
    return grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)


def ours(module: str) -> bool:
    return module.startswith(("suffixd.", "suffixcache"))


def module_edges(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    return {m: {_target(graph, m, i) for i in graph.find_modules_directly_imported_by(m)
                if ours(i)}
            for m in graph.modules if ours(m)}


def _target(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    """grimp sees no compiled module: ``from suffixcache import _native`` reaches it as an
    import of the package ``suffixcache``, which would close a circle that is not there
    (the package imports the importer). Such an edge goes to the compiled module itself."""
    if importer != imported and not importer.startswith(imported + "."):
        return imported
    named = set()
    for detail in graph.get_import_details(importer=importer, imported=imported):
        words = str(detail["line_contents"]).replace(",", " ").split()
        if len(words) >= 4 and words[0] == "from" and words[2] == "import":
            named.add(f"{words[1]}.{words[3]}" if words[1] == imported else words[1])
        elif len(words) >= 2 and words[0] == "import":
            named.add(words[1])
    compiled = {n for n in named if n not in graph.modules and _is_module(n)}
    return compiled.pop() if len(compiled) == 1 and len(named) == 1 else imported


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def test_the_graph_covers_the_daemon(graph: grimp.ImportGraph) -> None:
    # A graph that lost a part (a package missing from the install, a rename) would pass
    # every check below vacuously.
    parts = {part_of(m, "suffixd.daemon") for m in graph.modules} - {None}
    assert parts == set().union(*DAEMON_LAYERS)
    assert "suffixd.daemon.engine.session_state" in graph.modules
    assert len([m for m in graph.modules if m.startswith("suffixd.daemon.")]) > 40


def test_no_module_imports_one_that_imports_it_back(graph: grimp.ImportGraph) -> None:
    found = cycles(module_edges(graph))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_daemon_parts_import_only_parts_below(graph: grimp.ImportGraph) -> None:
    parts: dict[str, set[str]] = {}
    for importer, imported in module_edges(graph).items():
        a = part_of(importer, "suffixd.daemon")
        if a is None:
            continue
        parts.setdefault(a, set()).update(
            b for m in imported if (b := part_of(m, "suffixd.daemon")) not in (None, a))
    assert not cycles(parts)
    assert not layer_violations(parts, DAEMON_LAYERS)


def test_repository_layers(graph: grimp.ImportGraph) -> None:
    tops: dict[str, set[str]] = {}
    for importer, imported in module_edges(graph).items():
        a = _top(importer)
        tops.setdefault(a, set()).update(_top(m) for m in imported)
    assert not layer_violations(tops, TOP_LAYERS)


def _top(module: str) -> str:
    return "suffixcache" if module.startswith("suffixcache") else ".".join(module.split(".")[:2])


@pytest.mark.parametrize("part", sorted(FORBIDDEN_EXTERNAL))
def test_lower_parts_know_nothing_of_the_transports(graph: grimp.ImportGraph,
                                                    part: str) -> None:
    modules = {m for m in graph.modules if m == part or m.startswith(part + ".")}
    assert modules
    bad = sorted(
        f"{m} -> {i}" for m in modules for i in graph.find_modules_directly_imported_by(m)
        if i.split(".")[0] in FORBIDDEN_EXTERNAL[part]
    )
    assert not bad


# The checks themselves, on small graphs whose answers are known.

def test_cycles_finds_circles_and_only_circles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    two = cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}})
    assert sorted(two) == [["a", "b"], ["c", "d"]]


def test_layer_violations_flags_siblings_and_upward_imports() -> None:
    layers = [{"top"}, {"left", "right"}, {"base"}]
    ok = {"top": {"left", "base"}, "left": {"base"}, "right": {"base"}}
    assert layer_violations(ok, layers) == []
    assert layer_violations({"left": {"right"}, "base": {"top"}}, layers) == [
        "base -> top", "left -> right"]
