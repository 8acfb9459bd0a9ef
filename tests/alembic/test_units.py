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
    InstallCoreOp,
    UninstallCoreOp,
    alter_statements,
    spec_from_options,
    spec_options,
)
from fencekit.cli.alembic import register
from fencekit.declare import INFO_KEY, declare_fence, declared_fence, declared_fences, fenced
from fencekit.spec import FenceSpec, Scope, SpecError, TableName

SPEC = FenceSpec(TableName("My Schema", "billing"), Scope.KEY, key=("account_id",))


def render(*ops: alembic_ops.MigrateOperation) -> str:
    """The body of ``upgrade()`` as autogenerate writes it, compiled to prove it is valid."""
    code = "def upgrade():\n    " + render_python_code(alembic_ops.UpgradeOps(ops=list(ops)))
    compile(code, "<migration>", "exec")
    return code


# ---------------------------------------------------------------- operations


def test_reverse_pairs() -> None:
    create = CreateFenceOp(SPEC, 1)
    drop = create.reverse()
    assert isinstance(drop, DropFenceOp)
    assert (drop.spec, drop.template_version) == (SPEC, 1)
    assert isinstance(drop.reverse(), CreateFenceOp)
    assert isinstance(InstallCoreOp(2).reverse(), UninstallCoreOp)
    new = SPEC.with_changes(on_equal="reject")
    back = AlterFenceOp(SPEC, 1, new, 2).reverse()
    assert (back.old, back.old_template_version, back.new, back.template_version) == (
        new,
        2,
        SPEC,
        1,
    )
    assert create.to_diff_tuple()[:3] == ("create_fence", "My Schema", "billing")


def test_alter_cannot_move_a_fence() -> None:
    with pytest.raises(SpecError, match="cannot move"):
        AlterFenceOp(SPEC, 1, SPEC.with_changes(table=TableName("public", "other")), 1)


def test_spec_options_round_trip_and_reject_unknown() -> None:
    assert spec_from_options("billing", "My Schema", spec_options(SPEC)) == SPEC
    with pytest.raises(SpecError, match="unknown fence option"):
        spec_from_options("billing", None, {"scope": "row", "colour": "red"})
    assert spec_from_options("t", None, {}).table == TableName("public", "t")


def test_policy_alter_is_protect_and_key_alter_reprotects() -> None:
    policy = AlterFenceOp(SPEC, 1, SPEC.with_changes(on_missing="allow"), 1)
    assert alter_statements(policy) == sqlgen.protect_statements(policy.new, 1)
    rekey = AlterFenceOp(SPEC, 1, SPEC.with_changes(key=("account_id", "region")), 1)
    statements = alter_statements(rekey)
    assert statements[: len(sqlgen.unprotect_statements(SPEC, 1))] == (
        sqlgen.unprotect_statements(SPEC, 1)
    )


# ---------------------------------------------------------------- rendering


def test_rendered_create_is_explicit_and_valid_python() -> None:
    code = render(CreateFenceOp(SPEC, 1))
    for part in (
        "op.create_fence(",
        "'billing'",
        "schema='My Schema'",
        "scope='key'",
        "key=['account_id']",
        "on_missing='reject'",
        "on_equal='accept'",
        "template_version=1",
    ):
        assert part in code


def test_rendered_alter_and_core_ops() -> None:
    code = render(InstallCoreOp(2), AlterFenceOp(SPEC, 1, SPEC.with_changes(on_equal="reject"), 1))
    assert "op.install_fencekit(\n        core_version=2,\n    )" in code
    assert "old_template_version=1" in code
    assert "'on_equal': 'reject'" in code.split("new=", 1)[1]


def test_template_version_is_checked() -> None:
    from fencekit.alembic_plugin.ops import _check_template_version

    with pytest.raises(ValueError, match="upgrade fencekit"):
        _check_template_version(sqlgen.TEMPLATE_VERSION + 1)
    with pytest.raises(TypeError):
        _check_template_version("1")  # type: ignore[arg-type]


# ---------------------------------------------------------------- declarations


def test_declare_on_core_table() -> None:
    md = MetaData()
    t = Table("t", md, Column("id", Integer, primary_key=True), Column("note", Text))
    spec = declare_fence(t, scope="key", key=["id"], on_equal="reject")
    assert spec.table == TableName("public", "t")
    assert declared_fence(t) == spec
    assert t.info[INFO_KEY] == spec.to_dict()  # JSON-ready: renders as valid Python
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
