"""The package's import graph: every import goes down the layers, and no module imports itself
back through others (imports inside functions included: hiding one there is still a circle).

Layers, bottom up (``README.md``, map of the code): a unit may import only units on lower
floors, and the package root (which holds only the version).
"""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "interp_seal"

FLOORS = {
    "inputs": -1,  # what is read: below outputs, whose run marks it parses
    "outputs": 0,
    "shards": 0,
    "defaults": 0,
    "records": 1,
    "checkpoints": 1,
    "tasks": 2,
    "models": 3,
    "interventions": 4,
    "engine": 5,
    "evaluation": 6,
    "analysis": 7,
    "tuning": 8,
    "viz": 8,
    "provenance": 8,
    "organism": 9,
    "figures": 9,
    "widgets": 9,
    "cli": 10,
    "testing": 10,
    "browser": 10,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """``{module: modules of interp_seal it imports}``, every import statement anywhere."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_unit_has_a_floor():
    units = {unit(m) for m in imports()} - {""}
    assert units == set(FLOORS), "give the new unit a floor in FLOORS and in the README's map"


def test_imports_go_down_the_layers():
    upward = [
        f"{module} -> {target}"
        for module, targets in imports().items()
        for target in targets
        if unit(target) not in ("", unit(module)) and FLOORS[unit(target)] >= FLOORS[unit(module)]
    ]
    assert upward == []


def test_no_import_circles():
    graph = imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append(" -> ".join(path[path.index(target) :] + [target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    # a package's __init__ re-exports its modules, and they import siblings through it
    circles = [c for c in circles if not _through_package_init(c)]
    assert circles == []


def _through_package_init(circle: str) -> bool:
    steps = circle.split(" -> ")
    return any(b.startswith(a + ".") or a.startswith(b + ".") for a, b in pairwise(steps))
