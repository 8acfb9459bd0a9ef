"""The product is not the lab, and the import graph runs one way (docs/dev/architecture.md).

Server-free: reads the source with ``ast``, imports nothing it checks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fencekit"
PLUGIN = ROOT / "pytest-fencekit" / "pytest_fencekit"  # the sibling distribution


def _module_name(path: Path) -> str:
    base = PLUGIN.parent if path.is_relative_to(PLUGIN) else ROOT
    rel = path.relative_to(base).with_suffix("")
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


def _plugin_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PLUGIN.rglob("*.py"))}


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


def test_no_cli_command_imports_another() -> None:
    """Each ``fencekit/cli/<command>.py`` imports only ``fencekit.cli``, ``fencekit.cli.common``
    and ``fencekit.cli.hints``, at any depth (a command imported inside a function is still a
    cycle in waiting): a new command never has to read another to be understood."""
    cli = PACKAGE / "cli"
    shared = {"__init__", "__main__", "common", "hints"}  # hints: catalog fixes as CLI text
    commands = {f"fencekit.cli.{p.stem}" for p in cli.glob("*.py") if p.stem not in shared}
    offenders = {
        name: sorted(i for i in _imports(path, top_level_only=False) if i in commands - {name})
        for name, path in _modules().items()
        if name in commands
    }
    assert {k: v for k, v in offenders.items() if v} == {}


#: The layers of fencekit/, from pure data to I/O (docs/dev/architecture.md, "Layers"): a module
#: imports only from its own layer or lower ones, at any depth.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("fencekit.spec", "fencekit.ident", "fencekit.errors"),
    (
        "fencekit._psycopg_errors", "fencekit.context", "fencekit.wire", "fencekit.sqlgen",
        "fencekit.ddl",
    ),
    ("fencekit.catalog", "fencekit.embedded", "fencekit.declare"),
    (
        "fencekit.psycopg", "fencekit.psycopg2", "fencekit.asyncpg", "fencekit._psycopg_internals",
        "fencekit._psycopg_core", "fencekit._psycopg_async", "fencekit._psycopg_sync",
        "fencekit._sqlalchemy_errors",
        "fencekit.sqlalchemy", "fencekit.django", "fencekit.alembic_plugin",
        "fencekit._alembic_entry", "fencekit.leases", "fencekit.metrics", "fencekit.tasks",
        "fencekit.chaos", "fencekit.testing",
    ),
    ("fencekit.cli", "fencekit.bench", "fencekit.demo"),
)  # fmt: skip


def _layer(module: str) -> int | None:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def test_every_module_has_a_layer() -> None:
    unplaced = [name for name in _modules() if name != "fencekit" and _layer(name) is None]
    assert unplaced == [], "add them to LAYERS (and to docs/dev/architecture.md)"


def test_imports_run_from_pure_data_to_io() -> None:
    """Nothing lower imports anything higher (the package's __init__ re-exports the public API
    and is exempt)."""
    modules = _modules()
    upward = []
    for name, path in modules.items():
        mine = _layer(name)
        if mine is None:
            continue
        for imp in _imports(path, top_level_only=False):
            target = next((m for m in (imp, imp.rsplit(".", 1)[0]) if m in modules), None)
            if target is None or target == "fencekit":
                continue
            theirs = _layer(target)
            if theirs is not None and theirs > mine:
                upward.append(f"{name} (layer {mine}) imports {target} (layer {theirs})")
    assert sorted(set(upward)) == []


#: What each part of fencekit/ may import of the others (the unit is the longest LAYERS prefix
#: naming the module; names without "fencekit." are fencekit's). Narrower than the layers: an
#: adapter does not import the testing kit, the CLI or another adapter although they share a
#: layer. A new import between parts is a design decision: add it here, on purpose.
ALLOWED: dict[str, set[str]] = {
    "fencekit.spec": {"errors", "ident"},
    "fencekit.ident": set(),
    "fencekit.errors": set(),
    "fencekit._psycopg_errors": {"errors"},
    "fencekit.context": {"errors"},
    "fencekit.wire": {"context", "errors"},
    "fencekit.sqlgen": {"errors", "ident", "spec"},
    "fencekit.ddl": {"errors", "ident", "spec"},
    "fencekit.catalog": {"errors", "ident", "spec", "sqlgen"},
    "fencekit.embedded": {"errors"},
    "fencekit.declare": {"errors", "spec"},
    # psycopg 3's adapter: a public face over one core and its asyncio half, from which the
    # sync half is generated (scripts/async_to_sync.py).
    "fencekit.psycopg": {
        "_psycopg_async", "_psycopg_core", "_psycopg_internals", "_psycopg_sync", "wire",
    },
    "fencekit._psycopg_core": {"_psycopg_internals", "context", "errors", "metrics", "wire"},
    "fencekit._psycopg_async": {"_psycopg_core", "_psycopg_internals", "context", "wire"},
    "fencekit._psycopg_sync": {"_psycopg_core", "_psycopg_internals", "context", "wire"},
    "fencekit.psycopg2": {"context", "errors", "metrics", "wire"},
    "fencekit.asyncpg": {"context", "errors", "metrics", "wire"},
    "fencekit._psycopg_internals": set(),
    # SQLAlchemy runs on each driver: it installs that driver's adapter.
    "fencekit.sqlalchemy": {
        "_sqlalchemy_errors", "asyncpg", "context", "declare", "errors", "metrics", "psycopg",
        "psycopg2", "spec", "wire",
    },
    # The plugin's rejections as DBAPIErrors too, and a lost COMMIT as an outcome unknown.
    "fencekit._sqlalchemy_errors": {"context", "errors"},
    # The app reads leases from DATABASES, quotes role names for its grant operations, and its
    # enforce operation reads the rollout report (catalog.rollout); alembic's does too.
    "fencekit.django": {
        "catalog", "context", "errors", "ident", "leases", "metrics", "spec", "sqlgen", "wire",
    },
    "fencekit.alembic_plugin": {
        "_alembic_entry", "catalog", "declare", "errors", "ident", "spec", "sqlgen",
    },
    "fencekit._alembic_entry": {"alembic_plugin"},
    "fencekit.leases": {"context", "errors"},
    "fencekit.metrics": {"errors"},
    "fencekit.tasks": {"errors", "leases", "psycopg"},
    "fencekit.chaos": {"embedded", "errors", "leases", "psycopg", "spec", "sqlgen"},
    "fencekit.testing": {"chaos", "declare", "errors", "metrics", "spec", "sqlgen"},
    "fencekit.cli": {
        "alembic_plugin", "bench", "catalog", "chaos", "ddl", "demo", "embedded", "errors",
        "ident", "spec", "sqlgen",
    },
    "fencekit.bench": {
        "asyncpg", "context", "psycopg", "psycopg2", "spec", "sqlalchemy", "sqlgen", "wire",
    },
    "fencekit.demo": {"context", "embedded", "errors", "leases", "psycopg", "spec", "sqlgen"},
    # pytest-fencekit's plugin: the kit and the server it may start; fencekit imports none of it.
    "pytest_fencekit": {"embedded", "errors", "testing"},
}  # fmt: skip


def _unit(module: str) -> str | None:
    units = [u for u in ALLOWED if module == u or module.startswith(u + ".")]
    return max(units, key=len) if units else None


def test_every_part_has_an_allow_list() -> None:
    assert set(ALLOWED) - {"pytest_fencekit"} == {u for layer in LAYERS for u in layer}


def test_each_part_imports_only_what_it_is_allowed() -> None:
    """Per part, at any depth (inside functions too): fencekit's own imports are on its
    allow-list, and nothing in fencekit imports pytest-fencekit."""
    known = {**_modules(), **_plugin_modules()}
    found = []
    for name, path in known.items():
        mine = _unit(name)
        if mine is None:
            continue
        for imp in _imports(path, top_level_only=False):
            if imp.split(".")[0] == "pytest_fencekit" and mine != "pytest_fencekit":
                found.append(f"{name} imports {imp} (the plugin is pytest-fencekit's)")
                continue
            target = next((m for m in (imp, imp.rsplit(".", 1)[0]) if m in known), None)
            if target is None or target == "fencekit":
                continue
            theirs = _unit(target)
            if theirs is None or theirs == mine:
                continue
            if theirs.removeprefix("fencekit.") not in ALLOWED[mine]:
                found.append(f"{name} imports {target} ({mine} may not import {theirs})")
    assert sorted(set(found)) == []


def test_the_allow_list_keeps_the_layers() -> None:
    """An allowance never points up a layer."""
    upward = [
        f"{unit} -> {dep}"
        for unit, deps in ALLOWED.items()
        if unit != "pytest_fencekit"
        for dep in deps
        if (_layer(f"fencekit.{dep}") or 0) > (_layer(unit) or 0)
    ]
    assert upward == []


def test_exceptions_are_imported_from_errors() -> None:
    """fencekit/errors.py defines every exception class (docs/dev/architecture.md); inside the
    package they are imported from there, never through a module that re-exports one."""
    errors = ast.parse((PACKAGE / "errors.py").read_text(encoding="utf-8"))
    defined = {n.name for n in errors.body if isinstance(n, ast.ClassDef)}
    found = []
    for name, path in {**_modules(), **_plugin_modules()}.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if node.module.split(".")[0] not in ("fencekit", "pytest_fencekit"):
                continue
            if node.module != "fencekit.errors":
                found += [
                    f"{name}: {a.name} from {node.module}" for a in node.names if a.name in defined
                ]
    assert found == []
