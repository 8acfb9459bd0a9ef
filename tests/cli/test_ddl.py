"""``--from-ddl``: offline validation against CREATE/ALTER TABLE statements read with pglast.
Errors name the object and the file:line that defines it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fencekit import ddl, sqlgen
from fencekit.spec import FenceSpec, Scope, TableName

from .conftest import Cli

SCHEMA = """\
-- billing schema
CREATE TABLE billing_summary (
  account_id bigint PRIMARY KEY,
  region     text,
  total      numeric NOT NULL
);
CREATE TABLE app.ledger (
  id     bigint GENERATED ALWAYS AS IDENTITY,
  tenant int,
  "Entry Kind" text NOT NULL,
  amount numeric
);
ALTER TABLE app.ledger ADD CONSTRAINT ledger_pkey PRIMARY KEY (id);
ALTER TABLE app.ledger ALTER COLUMN tenant SET NOT NULL;
ALTER TABLE app.ledger ADD COLUMN note text, ADD COLUMN fencekit_fence integer;
CREATE TABLE events (id bigserial, day date NOT NULL) PARTITION BY RANGE (day);
CREATE TABLE events_2024 PARTITION OF events FOR VALUES FROM ('2024-01-01') TO ('2025-01-01');
"""

MORE = """\
SET search_path = archive, public;
CREATE TABLE events_2025 (id bigint NOT NULL, day date NOT NULL);
ALTER TABLE public.events ATTACH PARTITION events_2025
  FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
ALTER TABLE public.billing_summary RENAME COLUMN region TO area;
"""


@pytest.fixture
def schema_files(tmp_path: Path) -> list[str]:
    (tmp_path / "schema.sql").write_text(SCHEMA, encoding="utf-8")
    (tmp_path / "more.sql").write_text(MORE, encoding="utf-8")
    return [str(tmp_path / "schema.sql"), str(tmp_path / "more.sql")]


def _ddl_args(files: list[str]) -> list[str]:
    return [arg for f in files for arg in ("--from-ddl", f)]


@pytest.mark.parametrize(
    "argv",
    [
        ["billing_summary"],
        ["billing_summary", "--key", "account_id"],
        ["app.ledger", "--key", "tenant", "--key", "Entry Kind"],
        ["app.ledger", "--key", "id", "--scope", "key"],
        ["app.ledger", "--scope", "table"],
        ["app.ledger", "--column", "fence"],
    ],
)
def test_valid_specs_print_the_script(cli: Cli, schema_files: list[str], argv: list[str]) -> None:
    r = cli("sql", "protect", *argv, *_ddl_args(schema_files))
    assert r.code == 0, r.err
    assert r.out == cli("sql", "protect", *argv).out  # validation does not change the SQL


@pytest.mark.parametrize(
    ("argv", "where", "message"),
    [
        (["missing_table"], "", "table public.missing_table is not defined in"),
        (["ledger", "--key", "tenant"], "", "found app.ledger: qualify the table name"),
        (["billing_summary", "--key", "nope"], "schema.sql:2", "has no column 'nope'"),
        (["billing_summary", "--key", "region"], "", "has no column 'region'"),  # renamed
        (["billing_summary", "--key", "area"], "schema.sql:4", "key column 'area'"),
        (["app.ledger", "--key", "amount"], "schema.sql:11", "is nullable"),
        (["app.ledger", "--key", "note"], "schema.sql:15", "is nullable"),
        (["app.ledger"], "schema.sql:15", "already exists with type int4, not bigint"),
        (["events_2024"], "schema.sql:17", "is a partition of public.events"),
        (["archive.events_2025"], "more.sql:2", "is a partition of public.events"),
    ],
)
def test_invalid_specs_point_at_file_and_line(
    cli: Cli, schema_files: list[str], argv: list[str], where: str, message: str
) -> None:
    r = cli("sql", "protect", *argv, *_ddl_args(schema_files))
    assert r.code == 1
    assert r.out == ""
    assert message in r.err
    assert where in r.err
    assert r.err.count("\n") == 1


def test_partitioned_table_is_recognised_and_the_dba_told(
    cli: Cli, schema_files: list[str]
) -> None:
    r = cli("sql", "protect", "events", *_ddl_args(schema_files))
    assert r.code == 0
    assert r.out == sqlgen.render_protect(FenceSpec(TableName("public", "events")))
    assert "public.events is partitioned" in r.err
    assert "public.events_2024, archive.events_2025" in r.err
    assert "existing partition also gets fencekit's statement triggers" in r.err
    schema = ddl.read_ddl(schema_files)
    assert schema.tables[TableName("public", "events")].partitioned


def test_parse_error_points_at_the_line(cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "bad.sql"
    bad.write_text("CREATE TABLE ok (a int);\n\nCREATE TABLE broken (a int,, b int);\n")
    r = cli("sql", "protect", "ok", "--from-ddl", str(bad))
    assert r.code == 1
    assert f"{bad}:3: cannot parse SQL" in r.err


def test_alter_of_an_unknown_table_points_at_the_line(cli: Cli, tmp_path: Path) -> None:
    f = tmp_path / "alter.sql"
    f.write_text("CREATE TABLE a (x int);\nALTER TABLE b ADD COLUMN y int;\n")
    r = cli("sql", "protect", "a", "--from-ddl", str(f))
    assert r.code == 1
    assert f"{f}:2: table public.b is altered here" in r.err


def test_pg_dump_style_schema(tmp_path: Path) -> None:
    dump = tmp_path / "dump.sql"
    dump.write_text(
        "SET statement_timeout = 0;\n"
        "SELECT pg_catalog.set_config('search_path', '', false);\n"
        'CREATE TABLE "Sales"."Orders" (\n    "Order ID" bigint NOT NULL,\n    note text\n);\n'
        'ALTER TABLE ONLY "Sales"."Orders"\n'
        '    ADD CONSTRAINT "Orders_pkey" PRIMARY KEY ("Order ID");\n'
    )
    schema = ddl.read_ddl([dump])
    spec = FenceSpec(TableName("Sales", "Orders"), scope=Scope.KEY, key=("Order ID",))
    assert ddl.validate(spec, schema) == []
    assert schema.tables[TableName("Sales", "Orders")].primary_key == ("Order ID",)


def test_dropped_column_and_drop_not_null_are_replayed(tmp_path: Path) -> None:
    f = tmp_path / "s.sql"
    f.write_text(
        "CREATE TABLE t (a int NOT NULL, b int NOT NULL, c int);\n"
        "ALTER TABLE t DROP COLUMN a;\n"
        "ALTER TABLE t ALTER COLUMN b DROP NOT NULL;\n"
        "ALTER TABLE t ADD COLUMN IF NOT EXISTS c int;\n"
    )
    schema = ddl.read_ddl([f])
    with pytest.raises(ddl.DdlError, match="no column 'a'"):
        ddl.validate(FenceSpec(TableName("public", "t"), scope=Scope.KEY, key=("a",)), schema)
    with pytest.raises(ddl.DdlError, match=r"s\.sql:1: key column 'b' .* is nullable"):
        ddl.validate(FenceSpec(TableName("public", "t"), scope=Scope.KEY, key=("b",)), schema)
