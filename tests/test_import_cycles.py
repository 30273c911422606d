"""No import cycle among the modules of the node package or of the operator package.

Every import counts, wherever it is written: at module level, inside a function (a lazy import
hides a cycle from the interpreter, not from the design), under ``if TYPE_CHECKING:``. Layers
point inward (``node.main`` -> ``node.app`` -> ``node.api`` -> ``node.kv_service`` ->
``node.runtime`` -> ``node.state_machine`` -> ...), never back."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "quorum_node", ROOT / "operator" / "kafka_quorum_operator"]


def modules_of(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its own name)."""
    modules: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path) -> Iterator[str]:
    """The dotted names every import statement of the file names, anywhere in it."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            # ``from package import name``: the submodule ``name`` if there is one, else the
            # package (the graph resolves each to the longest module it names).
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a name resolves to its longest module)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imported in imported_names(name, path):
            target = imported
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one cycle
    through its modules, in import order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_through(graph, component) for component in components]


def _cycle_through(graph: Mapping[str, set[str]], component: set[str]) -> list[str]:
    """One cycle within ``component``, from its first module back to it (breadth first)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    return paths[node]
                if target not in paths:
                    paths[target] = [*paths[node], target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


@pytest.mark.parametrize("package", PACKAGES, ids=lambda path: path.name)
def test_no_import_cycle(package: Path) -> None:
    found = cycles(import_graph(modules_of(package)))
    assert not found, "import cycles: " + "; ".join(
        " -> ".join([*cycle, cycle[0]]) for cycle in found)


def test_the_check_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n")
    (package / "c.py").write_text("import pkg.a\n")
    assert cycles(import_graph(modules_of(package))) == [["pkg.a", "pkg.b", "pkg.c"]]


# Floors beneath the node: the node points down into them, never they up into the node. The
# backups and the simulator share the node's key-value state machine through ``quorum_node.kv``.
BENEATH_THE_NODE = ("quorum_node.kv", "quorum_node.raft", "quorum_node.storage",
                    "quorum_node.backup", "quorum_node.sim")


def upward_imports(graph: Mapping[str, set[str]], floors: tuple[str, ...],
                   above: str) -> list[str]:
    """Each import from a module of ``floors`` into ``above`` (or a module beneath it)."""
    def within(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    return sorted(f"{module} -> {target}" for module, targets in graph.items()
                  if any(within(module, floor) for floor in floors)
                  for target in targets if within(target, above))


def test_floors_beneath_the_node_do_not_import_it() -> None:
    graph = import_graph(modules_of(ROOT / "quorum_node"))
    found = upward_imports(graph, BENEATH_THE_NODE, "quorum_node.node")
    assert not found, "imports up into the node: " + "; ".join(found)


def test_the_floor_check_sees_an_upward_import(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "node").mkdir(parents=True)
    (package / "sim").mkdir()
    for path in ("__init__.py", "node/__init__.py", "node/kv.py", "sim/__init__.py"):
        (package / path).write_text("")
    (package / "sim" / "run.py").write_text("from pkg.node.kv import KvStore\n")
    graph = import_graph(modules_of(package))
    assert upward_imports(graph, ("pkg.sim",), "pkg.node") == ["pkg.sim.run -> pkg.node.kv"]
