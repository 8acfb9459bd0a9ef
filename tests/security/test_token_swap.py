"""One statement, one token: a trigger of the table's own that swaps fencekit.token.

The table's owner has a trigger that sets ``fencekit.token`` to a high value (999) while a
stale writer's statement runs: of every timing (BEFORE/AFTER, ROW/STATEMENT), named to sort
before fencekit's triggers (``a_swap``) or after them (``z_swap``). PostgreSQL fires triggers of
one timing in name order, so the name decides whether the swap comes before fencekit's check.

The writer is the application role (DML only) under a STALE token (5, below every fence of 10)
and writes by every path: INSERT, INSERT ... ON CONFLICT DO UPDATE, UPDATE, DELETE, MERGE and
COPY. What must hold:

- a row fence's row check judges each row by the token its statement check validated: a row
  that reads another token is refused (YF004, "changed during the statement"), a stale one as
  stale (YF001); a new row's fence is the checked token;
- a key fence reads the token once, after the statement, and a table fence once, before it:
  the whole statement is judged by the one token read;
- only where the swap comes before fencekit's one read (a BEFORE STATEMENT trigger sorting
  before the statement check; for a key fence anything before its AFTER STATEMENT trigger)
  is the statement judged, consistently, by the swapped token: that is owner code deciding
  its own table's token (docs/security.md, "Owner code that sets the token"), reported by
  ``fencekit status``. Then every fence the statement set is 999, never a mix.
"""

from __future__ import annotations

from typing import Any

import pytest

from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import (
    APP,
    DML,
    FENCE,
    STALE,
    Conn,
    Findings,
    fences,
    outcome,
    protect,
)

SWAPPED = 999

SCHEMA = f"""
CREATE FUNCTION swap_token() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('fencekit.token', '{SWAPPED}', true);
  IF TG_LEVEL = 'ROW' THEN
    RETURN COALESCE(NEW, OLD);
  END IF;
  RETURN NULL;
END $$;
CREATE TABLE sw (id int PRIMARY KEY, k int NOT NULL, v text);
"""
SEED = "INSERT INTO sw (id, k, v) VALUES (1, 1, 'a'), (2, 1, 'b')"

# (name, statement, COPY rows): every path writes row 1 or a new row of key 1.
PATHS: list[tuple[str, str, tuple[str, ...]]] = [
    ("INSERT", "INSERT INTO sw (id, k, v) VALUES (10, 1, 'i')", ()),
    (
        "INSERT ON CONFLICT DO UPDATE",
        "INSERT INTO sw (id, k, v) VALUES (1, 1, 'u') "
        "ON CONFLICT (id) DO UPDATE SET v = excluded.v",
        (),
    ),
    ("UPDATE", "UPDATE sw SET v = 'w' WHERE id = 1", ()),
    ("DELETE", "DELETE FROM sw WHERE id = 1", ()),
    (
        "MERGE",
        "MERGE INTO sw USING (VALUES (1)) AS s(id) ON sw.id = s.id "
        "WHEN MATCHED THEN UPDATE SET v = 'm'",
        (),
    ),
    (
        "MERGE with INSERT and UPDATE actions",
        "MERGE INTO sw USING (VALUES (1)) AS s(id) ON sw.id = s.id "
        "WHEN MATCHED THEN UPDATE SET v = 'm' "
        "WHEN NOT MATCHED THEN INSERT (id, k, v) VALUES (s.id, 1, 'n')",
        (),
    ),
    ("COPY", "COPY sw (id, k, v) FROM STDIN", ("10\t1\tc",)),
]

TIMINGS = [
    (when, level, name)
    for when in ("BEFORE", "AFTER")
    for level in ("ROW", "STATEMENT")
    for name in ("a_swap", "z_swap")
]


def _swapped_first(scope: str, when: str, level: str, name: str, path: str) -> bool:
    """Does the owner's swap come before fencekit's (last) statement-level read of the token?"""
    if scope == "key":  # read once, in the AFTER STATEMENT trigger
        return not (when == "AFTER" and level == "STATEMENT" and name == "z_swap")
    if when != "BEFORE" or level != "STATEMENT":
        return False
    # The statement check reads it first, unless the trigger sorts before it. An upsert (and a
    # MERGE with several kinds of action) fires BEFORE STATEMENT triggers for INSERT, then for
    # UPDATE: a row fence's check for UPDATE
    # (it passed the stale token for INSERT, fences being per row) reads what the INSERT
    # firing's z_swap set, and SQL cannot tell that second firing from a new statement. A
    # table fence refuses the stale token in its first firing.
    upsert_again = scope == "row" and path in (
        "INSERT ON CONFLICT DO UPDATE",
        "MERGE with INSERT and UPDATE actions",
    )
    return name == "a_swap" or upsert_again


def _look(db: Conn, scope: str) -> dict[str, Any]:
    fence_col = ", fencekit_fence" if scope == "row" else ""
    rows = db.execute(f"SELECT id, k, v{fence_col} FROM sw ORDER BY id").fetchall()
    return {"rows": {r[0]: r[1:] for r in rows}, "fences": fences(db, "public.sw")}


def _fences_set(scope: str, before: dict[str, Any], after: dict[str, Any]) -> list[Any]:
    """The fences the statement wrote: of the rows it wrote (row fence) or of the key/table."""
    if scope == "row":
        return [new[-1] for rid, new in after["rows"].items() if new != before["rows"].get(rid)]
    return [f for key, f in after["fences"].items() if before["fences"].get(key) != f]


@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_an_owner_trigger_that_swaps_the_token_never_judges_a_row_by_a_second_token(
    db: Conn, make_role: Any, findings: Findings, scope: str
) -> None:
    db.execute(SCHEMA)
    table = TableName("public", "sw")
    spec = {
        "row": FenceSpec(table),
        "key": FenceSpec(table, scope=Scope.KEY, key=("k",)),
        "table": FenceSpec(table, scope=Scope.TABLE),
    }[scope]
    protect(db, spec)
    db.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
    db.execute(SEED)
    db.commit()
    make_role(APP, DML)
    start = _look(db, scope)
    db.rollback()
    for when, level, name in TIMINGS:
        db.execute(
            f"CREATE TRIGGER {name} {when} INSERT OR UPDATE OR DELETE ON sw "
            f"FOR EACH {level} EXECUTE FUNCTION swap_token()"
        )
        db.commit()
        for path, stmt, copy_rows in PATHS:
            first = _swapped_first(scope, when, level, name, path)
            label = f"{scope} fence, {when} {level} trigger {name}, {path}"
            got = outcome(db, stmt, token=STALE, role=APP, copy_rows=copy_rows)
            new_row_only = scope == "row" and path in ("INSERT", "COPY")
            if first:
                # Owner code set the token before fencekit read it: one token, the swapped one.
                if not findings.check(label, got.ok, f"refused: {got.sqlstate} {got.message}"):
                    continue
                db.execute("RESET ROLE")
                set_ = _fences_set(scope, start, _look(db, scope))
                db.rollback()
                # A row fence's DELETE leaves no row (and no fence) behind.
                some = bool(set_) or (scope == "row" and path == "DELETE")
                findings.check(
                    label, some and all(f == SWAPPED for f in set_), f"fences set: {set_}"
                )
                continue
            if new_row_only:
                # A new row has no fence to be stale against: it carries the checked token,
                # or is refused because the row read another.
                if not got.ok:
                    findings.expect(label, got, "YF004")
                    continue
                db.execute("RESET ROLE")
                set_ = _fences_set(scope, start, _look(db, scope))
                db.rollback()
                findings.check(label, set_ == [STALE], f"new row's fence: {set_}")
                continue
            # A stale write: refused, as stale or because a row read a second token.
            if got.ok:
                db.execute("RESET ROLE")
                after = _look(db, scope)
                db.rollback()
                findings.check(label, False, f"stale write landed: {after}")
                continue
            findings.expect(label, got, ("YF001", "YF004"))
        db.execute(f"DROP TRIGGER {name} ON sw")
        db.commit()
    end = _look(db, scope)
    db.rollback()
    findings.check("the table after every attack", end == start, f"{start} -> {end}")
    findings.assert_clean()


def test_a_row_that_reads_a_swapped_token_is_refused_as_changed(db: Conn, make_role: Any) -> None:
    """The message names the token checked and the token read (docs/reference.md)."""
    db.execute(SCHEMA)
    protect(db, FenceSpec(TableName("public", "sw")))
    db.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
    db.execute(SEED)
    db.execute(
        "CREATE TRIGGER a_swap BEFORE UPDATE ON sw FOR EACH ROW EXECUTE FUNCTION swap_token()"
    )
    db.commit()
    make_role(APP, DML)
    got = outcome(db, "UPDATE sw SET v = 'x' WHERE id = 1", token=STALE, role=APP)
    assert got.sqlstate == "YF004", got
    assert f"checked as '{STALE}', then read as {SWAPPED}" in got.message, got.message
