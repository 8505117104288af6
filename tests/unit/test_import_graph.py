"""The product's import graph (grimp, the graph import-linter checks its contracts on): no
cycle anywhere, and no Redis, HTTP, git or ZMQ client outside ``tasks.adapters``.

``jobs.simulator`` is the engine simulator, a product of its own that serves HTTP and publishes
ZMQ itself; it is no prewarm code path, so the client rule does not cover it (it is still in the
cycle check, and prewarm imports nothing from it outside ``jobs.demo`` and the tests).
"""

from __future__ import annotations

import grimp
import pytest

PRODUCT = ("pipeline", "models", "tasks", "jobs")
CLIENTS = ("redis", "httpx", "git", "zmq")
ADAPTERS = "tasks.adapters"
SIMULATOR = "jobs.simulator"


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PRODUCT, include_external_packages=True)


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(start: str) -> None:  # Tarjan's algorithm, iterative (the graph is deep)
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start) & modules)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    imported = graph.find_modules_directly_imported_by(child) & modules
                    work.append((child, iter(sorted(imported))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.find_modules_directly_imported_by(node):
                    found.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            strong(module)
    return found


def _product_modules(graph: grimp.ImportGraph) -> set[str]:
    return {m for m in graph.modules if m.split(".")[0] in PRODUCT}


def test_cycle_finder_finds_a_cycle():
    graph = grimp.ImportGraph()
    for a, b in (("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")):
        graph.add_import(importer=a, imported=b)
    assert _cycles(graph, {"a", "b", "c", "d"}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_product(graph):
    assert _cycles(graph, _product_modules(graph)) == []


def test_no_client_library_outside_the_adapters(graph):
    outside = {
        m
        for m in _product_modules(graph)
        if not (m == ADAPTERS or m.startswith(ADAPTERS + "."))
        and not (m == SIMULATOR or m.startswith(SIMULATOR + "."))
    }
    offenders = sorted(
        f"{module} imports {client}"
        for module in outside
        for client in CLIENTS
        if client in graph.find_modules_directly_imported_by(module)
    )
    assert offenders == []
