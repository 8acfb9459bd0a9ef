"""The product is not the lab, and the import graph runs one way (docs/dev/architecture.md).

Server-free: reads the source with ``ast``, imports nothing it checks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fencekit"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, *, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_product_module_imports_the_lab_or_the_tests() -> None:
    offenders = {
        name: sorted(i for i in _imports(path, top_level_only=False) if i.split(".")[0] == "tests")
        for name, path in _modules().items()
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_no_product_module_assumes_a_checkout() -> None:
    """A path climbing out of the package (``parents[2]`` and the like) is site-packages once
    installed: the wheel must not look for the repository."""
    bad = []
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        for marker in ("parents[2]", "parents[3]", "scripts/_", '"scripts"'):
            if marker in text:
                bad.append(f"{name}: {marker}")
    assert bad == []


def test_module_level_imports_have_no_cycle() -> None:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for imp in _imports(path, top_level_only=True):
            # "from fencekit.x import y" names fencekit.x.y when y is a module, else fencekit.x
            if imp in modules:
                deps.add(imp)
        deps.discard(name)
        # a package's __init__ importing its own submodules is not a cycle through them
        graph[name] = {d for d in deps if not (d.startswith(name + ".") and name in modules)}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == []
