"""The generated SQL of every scope and option, as reviewed: a change to the generator shows up
as a diff of tests/sqlgen/golden/ in review, or fails here until it is regenerated."""

from __future__ import annotations

import pytest

from tests.sqlgen.golden_specs import GOLDEN, SPECS, path, render

REGENERATE = "review the change, then regenerate: .venv/bin/python -m tests.sqlgen.regen"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_generated_sql_matches_its_golden_file(name: str) -> None:
    golden = path(name)
    assert golden.exists(), f"{golden} is missing: {REGENERATE}"
    assert render(name) == golden.read_text(encoding="utf-8"), (
        f"the SQL generated for {name!r} changed: {REGENERATE}"
    )


def test_no_stale_golden_files() -> None:
    stale = sorted(p.name for p in GOLDEN.glob("*.sql") if p.stem not in SPECS)
    assert not stale, f"golden files without a spec: {stale}: {REGENERATE}"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_golden_sql_runs_and_undoes_itself(db, name: str) -> None:
    """Each golden script protects a real table, re-runs as a no-op, and unprotects it."""
    db.execute(
        "CREATE SCHEMA app; CREATE TABLE app.invoices (id int PRIMARY KEY, "
        "tenant_id int NOT NULL, account_id int NOT NULL, amount int)"
    )
    db.commit()
    protect, _, unprotect = render(name).partition("\nCOMMIT;\n\n")
    db.execute((protect + "\nCOMMIT;\n").encode())
    db.execute((protect + "\nCOMMIT;\n").encode())
    assert db.execute("SELECT count(*) FROM fencekit.protected").fetchone() == (1,)
    db.execute(unprotect.encode())
    assert db.execute("SELECT count(*) FROM fencekit.protected").fetchone() == (0,)
    left = db.execute(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'app.invoices'::regclass "
        "AND NOT tgisinternal"
    ).fetchone()
    assert left == (0,)
    db.rollback()
