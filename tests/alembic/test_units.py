"""Pure tests: operations, rendering, declarations, filters, CLI and plugin wiring."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from alembic.autogenerate import render_python_code
from alembic.operations import ops as alembic_ops
from sqlalchemy import Column, Integer, MetaData, Table, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import fencekit._alembic_entry as entry
from fencekit import sqlgen
from fencekit.alembic_plugin import include_name, include_object
from fencekit.alembic_plugin.ops import (
    AlterFenceOp,
    CreateFenceOp,
    DropFenceOp,
    FenceOp,
    InstallCoreOp,
    UninstallCoreOp,
    spec_from_options,
    spec_options,
)
from fencekit.alembic_plugin.render import render_sql
from fencekit.cli.alembic import register
from fencekit.declare import INFO_KEY, declare_fence, declared_fence, declared_fences, fenced
from fencekit.spec import FenceSpec, Scope, SpecError, TableName
from fencekit.sqlgen import FenceChange

SPEC = FenceSpec(TableName("My Schema", "billing"), Scope.KEY, key=("account_id",))


def render(*ops: alembic_ops.MigrateOperation) -> str:
    """The body of ``upgrade()`` as autogenerate writes it, compiled to prove it is valid."""
    code = "def upgrade():\n    " + render_python_code(alembic_ops.UpgradeOps(ops=list(ops)))
    compile(code, "<migration>", "exec")
    return code


# ---------------------------------------------------------------- operations


def test_reverse_pairs_swap_the_frozen_sql() -> None:
    create = CreateFenceOp(FenceChange(None, SPEC, ["SELECT 'protect'"], ["SELECT 'unprotect'"]))
    drop = create.reverse()
    assert isinstance(drop, DropFenceOp)
    assert (drop.spec, drop.sql, drop.undo_sql) == (SPEC, ("SELECT 'unprotect'",), create.sql)
    assert isinstance(drop.reverse(), CreateFenceOp)
    assert drop.reverse().sql == create.sql
    assert isinstance(InstallCoreOp(2).reverse(), UninstallCoreOp)
    new = SPEC.with_changes(on_equal="reject")
    alter = AlterFenceOp(
        FenceChange(SPEC, new, ["SELECT 1"], ["SELECT 2"]), note="up", undo_note="down"
    )
    back = alter.reverse()
    assert isinstance(back, AlterFenceOp)
    assert (back.old, back.new, back.sql, back.undo_sql) == (
        new,
        SPEC,
        ("SELECT 2",),
        ("SELECT 1",),
    )
    assert (back.note, back.undo_note) == ("down", "up")
    assert create.to_diff_tuple()[:3] == ("create_fence", "My Schema", "billing")


def test_generated_ops_freeze_the_one_change_model_both_ways() -> None:
    create = FenceOp.generate(None, SPEC)
    assert isinstance(create, CreateFenceOp)
    assert create.sql == tuple(sqlgen.protect_statements(SPEC))
    assert create.undo_sql == tuple(sqlgen.unprotect_statements(SPEC))
    drop = FenceOp.generate(SPEC, None)
    assert isinstance(drop, DropFenceOp)
    assert drop.sql == create.undo_sql
    new = SPEC.with_changes(key=("account_id", "region"))
    alter = FenceOp.generate(SPEC, new)
    assert isinstance(alter, AlterFenceOp)
    assert alter.sql == tuple(sqlgen.change_statements(SPEC, new))
    assert alter.undo_sql == tuple(sqlgen.change_statements(new, SPEC))


def test_ops_without_sql_render_the_current_template_when_run() -> None:
    assert CreateFenceOp(FenceChange(None, SPEC)).statements() == sqlgen.protect_statements(SPEC)
    assert DropFenceOp(FenceChange(SPEC, None)).statements() == sqlgen.unprotect_statements(SPEC)
    new = SPEC.with_changes(on_missing="allow")
    assert AlterFenceOp(FenceChange(SPEC, new)).statements() == sqlgen.change_statements(SPEC, new)
    assert CreateFenceOp(FenceChange(None, SPEC, ["SELECT 1"])).statements() == ["SELECT 1"]
    assert CreateFenceOp(FenceChange(None, SPEC, ())).statements() == []


def test_sql_must_be_a_sequence_of_statements() -> None:
    with pytest.raises(TypeError, match="sequence of SQL statements"):
        FenceChange(None, SPEC, "SELECT 1; SELECT 2")
    with pytest.raises(TypeError, match="not an SQL statement"):
        FenceChange(SPEC, SPEC, [b"SELECT 1"])  # type: ignore[list-item]


def test_a_change_keeps_the_table() -> None:
    with pytest.raises(SpecError, match="keeps the table"):
        FenceChange(SPEC, SPEC.with_changes(table=TableName("public", "other")))


def test_spec_options_round_trip_and_reject_unknown() -> None:
    assert spec_from_options("billing", "My Schema", spec_options(SPEC)) == SPEC
    with pytest.raises(SpecError, match="unknown fence option"):
        spec_from_options("billing", None, {"scope": "row", "colour": "red"})
    assert spec_from_options("t", None, {}).table == TableName("public", "t")


def test_a_policy_change_re_protects_behind_the_guard_and_a_new_key_moves() -> None:
    policy = SPEC.with_changes(on_missing="allow")
    statements = sqlgen.change_statements(SPEC, policy)
    assert statements[-len(sqlgen.protect_statements(policy)) :] == sqlgen.protect_statements(
        policy
    )
    assert any("fencekit.move_guard(" in s for s in statements)  # refuses another old spec
    rekey = SPEC.with_changes(key=("account_id", "region"))
    # Another key is a move, fences carried, never unprotect + protect.
    moved = "\n".join(sqlgen.change_statements(SPEC, rekey))
    assert "fencekit_move_" in moved


def test_a_new_issuer_rebinds_the_resource_whichever_operation_runs_it() -> None:
    """One model: alembic, Django and the CLI all run change_statements, which forgets the
    resource's issuer binding before protect binds it to the new issuer."""
    etcd = SPEC.with_changes(issuer="etcd")
    zookeeper = SPEC.with_changes(issuer="zookeeper")
    statements = sqlgen.change_statements(etcd, zookeeper)
    assert any(s.startswith("DELETE FROM fencekit.resources") for s in statements)
    assert AlterFenceOp(FenceChange(etcd, zookeeper)).statements() == statements


def test_refresh_reprotects_and_its_downgrade_runs_nothing() -> None:
    refresh = AlterFenceOp.refresh(SPEC, sqlgen.TEMPLATE_VERSION - 1)
    assert (refresh.old, refresh.new) == (SPEC, SPEC)
    assert refresh.sql == tuple(sqlgen.change_statements(SPEC, SPEC))
    assert refresh.reverse().sql == ()
    code = render(refresh, refresh.reverse())
    assert '# fencekit: "My Schema".billing has objects of fence template ' in code
    assert "sql=()," in code


# ---------------------------------------------------------------- rendering


def frozen_calls(code: str) -> list[tuple[str, dict[str, object]]]:
    """Run rendered ``upgrade()`` against a recorder: (operation, keyword arguments)."""
    calls: list[tuple[str, dict[str, object]]] = []

    class Recorder:
        def __getattr__(self, name: str) -> object:
            return lambda *args, **kwargs: calls.append((name, kwargs))

    namespace: dict[str, object] = {"op": Recorder()}
    exec(code, namespace)
    namespace["upgrade"]()  # type: ignore[operator]
    return calls


def test_rendered_create_is_explicit_and_valid_python() -> None:
    op = FenceOp.generate(None, SPEC)
    code = render(op)
    for part in (
        "op.create_fence(",
        "'billing'",
        "schema='My Schema'",
        "scope='key'",
        "key=['account_id']",
        "on_missing='reject'",
        "on_equal='accept'",
        "sql=(",
    ):
        assert part in code
    assert "template_version=" not in code
    ((name, kwargs),) = frozen_calls(code)
    assert name == "create_fence"
    assert kwargs["sql"] == op.sql  # exactly the frozen statements, through alembic's indent


HOSTILE = [
    "",
    "it's",
    'say "x"',
    "both ' and \"",
    "back\\slash\\",
    "nul\x00 and \r\n and \u2028",
    '"""',
    "'''",
    'end"',
    "tab\t and trailing spaces   \n  indented\n",
    "unicod\u00e9 \u2603",
    "\n\n",
]


def test_render_sql_round_trips_any_statement() -> None:
    assert eval(render_sql(HOSTILE)) == tuple(HOSTILE)
    assert render_sql(()) == "()"
    # Through alembic's renderer (which re-indents every line) and into a migration body.
    op = CreateFenceOp(FenceChange(None, SPEC, HOSTILE))
    ((_, kwargs), (drop, undo)) = frozen_calls(render(op, op.reverse()))
    assert kwargs["sql"] == tuple(HOSTILE)
    # A reverse without frozen SQL is frozen when written: the current unprotect.
    assert (drop, undo["sql"]) == ("drop_fence", tuple(sqlgen.unprotect_statements(SPEC)))


def test_rendered_sql_is_one_line_per_sql_line() -> None:
    code = render(
        CreateFenceOp(FenceChange(None, SPEC, ["SELECT 1\nFROM t\nWHERE x = 'y'", "SELECT 2"]))
    )
    assert '            "SELECT 1\\n"\n            "FROM t\\n"\n' in code
    assert """            "WHERE x = 'y'",\n""" in code
    assert '            "SELECT 2",\n' in code


def test_rendered_alter_and_core_ops() -> None:
    new = SPEC.with_changes(on_equal="reject")
    code = render(InstallCoreOp(2), FenceOp.generate(SPEC, new))
    assert "op.install_fencekit(\n        core_version=2,\n    )" in code
    assert "'on_equal': 'reject'" in code.split("new=", 1)[1]
    assert "old_template_version" not in code
    calls = frozen_calls(code)
    assert calls[1][1]["sql"] == tuple(sqlgen.change_statements(SPEC, new))


# ---------------------------------------------------------------- declarations


def test_declare_on_core_table() -> None:
    md = MetaData()
    t = Table("t", md, Column("id", Integer, primary_key=True), Column("note", Text))
    spec = declare_fence(t, scope="key", key=["id"], on_equal="reject")
    assert spec.table == TableName("public", "t")
    assert declared_fence(t) == spec
    assert t.info[INFO_KEY] == spec.as_dict()  # JSON-ready: renders as valid Python
    assert list(declared_fences([md, MetaData()])) == [(t, spec)]


def test_declare_on_orm_class() -> None:
    class Base(DeclarativeBase):
        pass

    @fenced(scope="table", resource="jobs:all")
    class Job(Base):
        __tablename__ = "jobs"
        __table_args__ = {"schema": "work"}  # noqa: RUF012
        id: Mapped[int] = mapped_column(primary_key=True)

    spec = declared_fence(Job)
    assert spec is not None
    assert spec.table == TableName("work", "jobs")
    assert spec.resource == "jobs:all"


def test_declare_errors_are_actionable() -> None:
    md = MetaData()
    t = Table("t", md, Column("id", Integer, primary_key=True), Column("note", Text))
    with pytest.raises(SpecError, match="not a column"):
        declare_fence(t, scope="key", key=["nope"])
    with pytest.raises(SpecError, match="NOT NULL"):
        declare_fence(t, scope="key", key=["note"])
    with pytest.raises(SpecError, match="list of column names"):
        declare_fence(t, scope="key", key="id")
    with pytest.raises(TypeError, match="Table or a mapped ORM class"):
        declare_fence(object())


# ---------------------------------------------------------------- filters


def test_filters_hide_fencekit_objects_only() -> None:
    assert not include_name("fencekit", "schema", {})
    assert include_name("billing", "schema", {})
    assert not include_name("fences", "table", {"schema_name": "fencekit"})
    assert not include_object(None, "fencekit_fence", "column", True, None)
    assert include_object(None, "fencekit_fence", "column", False, object())  # declared
    assert include_object(None, "amount", "column", True, None)
    assert not include_object(None, "fencekit_t_1234_idx", "index", True, None)
    assert include_object(Table("x", MetaData()), "x", "table", True, None)
    assert not include_object(Table("x", MetaData(), schema="fencekit"), "x", "table", True, None)


# ---------------------------------------------------------------- CLI


def test_cli_init_writes_a_wired_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = argparse.ArgumentParser(prog="fencekit")
    register(parser.add_subparsers())
    monkeypatch.chdir(tmp_path)
    args = parser.parse_args(["alembic", "init", "migrations", "--metadata", "app.models:md"])
    assert args.func(args) == 0
    env = (tmp_path / "migrations" / "env.py").read_text()
    assert "fencekit_alembic.include_object" in env
    assert "autogenerate_plugins" in env
    assert "template_version" not in (tmp_path / "migrations" / "script.py.mako").read_text()
    assert "target_metadata = app.models:md" in (tmp_path / "alembic.ini").read_text()
    assert re.search(
        r"^script_location = \S*migrations$", (tmp_path / "alembic.ini").read_text(), re.M
    )
    again = parser.parse_args(["alembic", "init", "migrations"])
    assert again.func(again) == 1  # not empty: alembic refuses, we say so


# ---------------------------------------------------------------- wiring


def test_entry_point_targets_the_light_module() -> None:
    (ep,) = [ep for ep in entry_points(group="alembic.plugins") if ep.name == "fencekit"]
    assert ep.value == "fencekit._alembic_entry"
    assert list(entry) == [entry]  # alembic 1.18/1.19 iterate what the entry point loads


@pytest.mark.parametrize(
    "code",
    [
        "import fencekit.alembic_plugin",  # fencekit first: alembic loads the entry point inside
        "import alembic; import fencekit.alembic_plugin",
        "import alembic.command; import fencekit.alembic_plugin",
    ],
)
def test_plugin_registers_in_any_import_order(code: str) -> None:
    check = """
from alembic.operations import Operations
assert all(hasattr(Operations, n) for n in
           ("create_fence", "alter_fence", "drop_fence", "install_fencekit"))
try:
    from alembic.runtime.plugins import _all_plugins
except ImportError:  # alembic < 1.18: the import registered a global comparator
    from alembic.autogenerate.compare import comparators
    registered = comparators._registry[("schema", "default")]
    assert any("_alembic_entry" in f.__module__ for f in registered)
else:
    assert "fencekit" in _all_plugins
"""
    subprocess.run(
        [sys.executable, "-W", "error", "-c", f"{code}\n{check}"], check=True, timeout=60
    )
