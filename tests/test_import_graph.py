"""The import graph keeps its floors, and no package is in a cycle.

    dspark_core, contracts      leaves: the algorithm; the cell, records, backend protocol and name tables
    inputs                      tasks and model references (→ contracts, dspark_core)
    backends                    engines (→ dspark_core, contracts, inputs)
    harness                     suites, runner, metrics, store, gate, report (→ everything above, never recipes)
    recipes                     the pipelines that build models (→ any of them; nothing imports a recipe)

The graph is read from the source (every `import` and `from … import`, lazy ones inside functions
included, `if TYPE_CHECKING:` blocks excluded), so a cycle hidden behind a function-level import counts:
it is still two modules that cannot be understood one without the other. Run it alone with
`python3 -m pytest tests/test_import_graph.py -q`; a failure prints the cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dspark_core", "contracts", "inputs", "backends", "harness", "recipes")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(module: str, path: Path) -> set[str]:
    names: set[str] = set()
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return names


def import_graph() -> dict[str, set[str]]:
    """module → the project modules it imports (each name resolved to the longest module it names)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = set()
        for name in _imported_names(module, path):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
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
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _within(graph: dict[str, set[str]], prefix: str) -> dict[str, set[str]]:
    inside = {m for m in graph if m == prefix or m.startswith(prefix + ".")}
    return {m: graph[m] & inside for m in inside}


def test_no_cycle_inside_dspark_core():
    assert cycles(_within(import_graph(), "dspark_core")) == []


def test_no_cycle_inside_contracts_inputs_or_backends():
    graph = import_graph()
    for package in ("contracts", "inputs", "backends"):
        assert cycles(_within(graph, package)) == [], package


def test_dspark_core_imports_neither_harness_nor_backends():
    graph = import_graph()
    above = {
        (m, t) for m, targets in graph.items() if m.startswith("dspark_core")
        for t in targets if not t.startswith("dspark_core")
    }
    assert above == set()


def test_nothing_below_the_recipes_imports_them():
    """Recipes (the draft-training pipelines) are the top floor: they read the harness, never the reverse."""
    graph = import_graph()
    below = {
        (m, t) for m, targets in graph.items() if not m.startswith("recipes")
        for t in targets if t.startswith("recipes")
    }
    assert below == set()


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """top-level package → the other top-level packages its modules import (lazy imports included)."""
    out: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for module, targets in graph.items():
        top = module.split(".")[0]
        out[top] |= {t.split(".")[0] for t in targets} - {top}
    return out


def test_no_cycle_between_top_level_packages():
    packages = _package_graph(import_graph())
    assert cycles(packages) == [], {p: sorted(t) for p, t in packages.items()}


def test_top_level_packages_keep_their_layers():
    """Each package imports only the layers below it (the module docstring's arrows)."""
    allowed = {
        "dspark_core": set(), "contracts": set(), "inputs": {"contracts", "dspark_core"},
        "backends": {"dspark_core", "contracts", "inputs"},
        "harness": {"dspark_core", "contracts", "inputs", "backends"},
        "recipes": {"dspark_core", "contracts", "inputs", "backends", "harness"},
    }
    graph = import_graph()
    wrong = sorted((m, t) for m, targets in graph.items() for t in targets
                   if t.split(".")[0] != m.split(".")[0] and t.split(".")[0] not in allowed[m.split(".")[0]])
    assert wrong == []


def test_contracts_import_neither_harness_nor_backends():
    graph = import_graph()
    reached = {t for m, targets in graph.items() if m.startswith("contracts") for t in targets}
    assert {t for t in reached if not t.startswith("contracts")} == set()


def test_the_layer_test_sees_lazy_imports(tmp_path):
    """A function-level import is an edge: the reader the tests above rely on finds it."""
    path = tmp_path / "lazy.py"
    path.write_text("def f():\n    from harness.runner import run_suite\n    import backends.base as b\n")
    assert {"harness.runner", "harness.runner.run_suite", "backends.base"} <= _imported_names("contracts.lazy", path)


def test_kernels_import_nothing_from_the_core_above_them():
    """Dispatches sit beside their twins; the kernels package reads only the leaf `distributions`."""
    graph = import_graph()
    allowed = {"dspark_core.distributions"}
    reached = {
        t for m, targets in graph.items() if m.startswith("dspark_core.kernels")
        for t in targets if not t.startswith("dspark_core.kernels")
    }
    assert reached <= allowed, sorted(reached - allowed)


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
