"""fencekit never protects its own tables.

``fencekit protect fencekit.<anything>`` is refused. A spec naming a table
in schema ``fencekit`` is a SpecError, however the name is written or built. Belt and braces:
the generated SQL refuses it too (YF000), for a spec whose validation was bypassed and for a
script rendered for another table and edited by hand to name fencekit's. Protecting
``fencekit.fences`` would add triggers and, for a row fence, a column to the table every key
fence writes; ``fencekit.protected`` would fence the registry protect itself writes.
"""

from __future__ import annotations

import psycopg
import pytest

from fencekit.spec import FenceSpec, Scope, SpecError, TableName
from fencekit.sqlgen import protect_statements
from tests.security.conftest import Conn, Findings

# fencekit's tables and the first column of each (a key column for key fences).
OWN = {"fences": "resource", "protected": "schema_name", "resources": "resource",
       "meta": "key", "leases": "resource"}  # fmt: skip


def _spec(table: TableName, scope: str, key_column: str) -> FenceSpec:
    if scope == "key":
        return FenceSpec(table, scope=Scope.KEY, key=(key_column,))
    return FenceSpec(table, scope=Scope(scope))


@pytest.mark.parametrize(
    "text",
    ["fencekit.fences", '"fencekit".fences', ' fencekit . "protected" ', "fencekit.leases",
     "FENCEKIT.meta", "fencekit.resources", "fencekit.not_yet_there"],
)  # fmt: skip
@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_spec_refuses_fencekits_schema(text: str, scope: str) -> None:
    with pytest.raises(SpecError, match="fencekit"):
        _spec(TableName.parse(text), scope, "resource")


def test_spec_refuses_fencekits_schema_from_dict() -> None:
    # The form alembic migrations and the registry store.
    for table in ({"schema": "fencekit", "name": "fences"}, "fencekit.protected"):
        with pytest.raises(SpecError, match="fencekit"):
            FenceSpec.from_dict({"table": table, "scope": "table"})


def _forged(schema: str, name: str) -> TableName:
    """A TableName built without running any validation it may gain."""
    table = object.__new__(TableName)
    object.__setattr__(table, "schema", schema)
    object.__setattr__(table, "name", name)
    return table


def _why(err: psycopg.Error | None) -> str:
    return f"{err.sqlstate}: {str(err).splitlines()[0]}" if err else "applied"


def _apply(db: Conn, statements: list[str]) -> psycopg.Error | None:
    db.execute("SAVEPOINT own")
    try:
        for stmt in statements:
            db.execute(stmt.encode())
    except psycopg.Error as exc:
        db.execute("ROLLBACK TO SAVEPOINT own")
        return exc
    db.execute("ROLLBACK TO SAVEPOINT own")  # never keep it, even when it went through
    return None


def test_generated_sql_refuses_fencekits_tables(db: Conn, findings: Findings) -> None:
    for name, first in OWN.items():
        for scope in ("row", "key", "table"):
            # A spec object whose table was swapped after validation.
            spec = _spec(TableName("public", "decoy"), scope, first)
            object.__setattr__(spec, "table", _forged("fencekit", name))
            label = f"{scope} fence on fencekit.{name}, spec edited past validation"
            try:
                statements = protect_statements(spec)
            except SpecError:
                findings.check(label, True)  # refused while rendering: nothing to apply
            else:
                err = _apply(db, statements)
                findings.check(
                    label,
                    err is not None and err.sqlstate == "YF000",
                    f"expected YF000, got {_why(err)}",
                )
            # A script rendered for public.<name>, then edited by hand to name fencekit's table.
            label = f"{scope} fence on fencekit.{name}, rendered for public.{name} and hand-edited"
            db.execute(f"CREATE TABLE public.{name} (LIKE fencekit.{name})")
            rendered = protect_statements(_spec(TableName("public", name), scope, first))
            err = _apply(db, [s.replace("public", "fencekit") for s in rendered])
            findings.check(
                label,
                err is not None and err.sqlstate == "YF000",
                f"expected YF000, got {_why(err)}",
            )
            db.execute(f"DROP TABLE public.{name}")
    db.rollback()
    findings.assert_clean()
