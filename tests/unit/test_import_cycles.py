"""No module of the project imports itself back through others (issue 12).

The layers contract (`lint-imports`, setup.cfg) keeps imports going downwards between layers;
this keeps them acyclic inside a layer too, counting imports inside functions and under
TYPE_CHECKING, which is what makes a cycle hard to untangle later.
"""

from __future__ import annotations

import grimp
import pytest

pytestmark = pytest.mark.unit

PACKAGES = ("cdc", "snapshot", "sinks", "pipelines")


def import_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), iteratively."""
    imports = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(imports[node]):
                work.append((node, i + 1))
                nxt = imports[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return groups


def test_the_project_has_no_import_cycles() -> None:
    graph = grimp.build_graph(*PACKAGES)
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(module)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.x")
    graph.add_import(importer="a.z", imported="a.x")
    assert import_cycles(graph) == [["a.x", "a.y"]]
