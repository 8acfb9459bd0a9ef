"""One statement, one token: a statement that changes fencekit.token while it runs.

Every check reads ``fencekit.token`` once and validates it fully (missing:
the on_missing policy, YF003 under 'reject'; malformed: YF004; lower than the fence: YF001). A
statement that clears or changes the token mid-statement can never skip a check.

Each statement starts under a valid fresh token (so the statement-start check passes) and then
switches it with ``set_config('fencekit.token', ..., true)``: in WHERE, in SET, in RETURNING, in a
scalar subquery, in a column DEFAULT of the table (owner-defined), in a BEFORE or AFTER trigger
on another table written in the same statement (writable CTE), and in a function called per
row. It switches to '' (cleared), to malformed values and to a token LOWER than the fence.

The judge (``_judge``) knows which checks run after the switch: a key fence checks at the end
of the statement (every switch comes before it); a table fence checks once, at the start (no
switch comes before it); a row fence checks each row before writing it (a switch in RETURNING
or in an AFTER trigger comes after some or all rows). A rejection must carry the SQLSTATE of
what the late check read. A statement that succeeds must have been judged by the fresh token
wherever a check ran after the switch, except that under on_missing='allow' a cleared token may
pass as an unfenced write: counted, and no fence lowered. Never may a stale or malformed token's
write land, and never may a cleared token skip a check uncounted.

The app role acts through ``SET LOCAL ROLE`` on the owner's (superuser's) connection: the
statement runs with exactly its rights, and the same transaction can then ``RESET ROLE`` and
inspect rows, fences and counters before rolling back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import (
    APP,
    DML,
    FENCE,
    FRESH,
    Conn,
    Findings,
    counts,
    fences,
    outcome,
    protect,
)

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)

SCHEMA = """
-- Switches the token to what sec.flip says ('to:<value>'); does nothing when sec.flip is unset.
CREATE FUNCTION flip() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  want text := current_setting('sec.flip', true);
BEGIN
  IF want LIKE 'to:%' THEN
    PERFORM set_config('fencekit.token', substr(want, 4), true);
  END IF;
  RETURN '';
END $$;
CREATE FUNCTION flipped(x text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  RETURN x || flip();
END $$;
CREATE FUNCTION flip_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM flip();
  RETURN NEW;
END $$;
CREATE TABLE mid (id int PRIMARY KEY, k int NOT NULL, v text, d text DEFAULT flip());
CREATE TABLE side_before (x int);
CREATE TRIGGER side_flip BEFORE INSERT ON side_before FOR EACH ROW EXECUTE FUNCTION flip_trigger();
CREATE TABLE side_after (x int);
CREATE TRIGGER side_flip AFTER INSERT ON side_after FOR EACH ROW EXECUTE FUNCTION flip_trigger();
"""
SEED = "INSERT INTO mid (id, k, v) VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 1, 'c')"

# The value a statement switches the token to, and the SQLSTATE a check reading it must raise.
SWITCHES = {
    "": "YF003",  # cleared (under on_missing='allow': may pass as a counted unfenced write)
    "abc": "YF004",
    "0005": "YF004",
    "-1": "YF004",
    "1e3": "YF004",
    " 7": "YF004",
    "5": "YF001",  # lower than the fence
}


def _set(value: str) -> str:
    literal = "'" + value.replace("'", "''") + "'"
    return f"set_config('fencekit.token', {literal}, true)"


@dataclass(frozen=True)
class Context:
    name: str
    stmt: str  # {flip} is replaced by a set_config(...) call switching the token
    row_reach: str  # for a row fence: do 'all', 'some' or 'none' of the row checks follow it?


CONTEXTS = [
    Context(
        "set_config in WHERE (UPDATE)", "UPDATE mid SET v = 'w' WHERE {flip} IS NOT NULL", "all"
    ),
    Context("set_config in WHERE (DELETE)", "DELETE FROM mid WHERE {flip} IS NOT NULL", "all"),
    Context("set_config in SET", "UPDATE mid SET v = 's' || left({flip}, 0)", "all"),
    Context("set_config in RETURNING", "UPDATE mid SET v = 'r' RETURNING {flip}", "some"),
    Context(
        "set_config in a scalar subquery",
        "UPDATE mid SET v = (SELECT 'q' || left({flip}, 0))",
        "all",
    ),
    Context(
        "the table's column DEFAULT",
        "INSERT INTO mid (id, k, v) VALUES (1, 1, 'dflt') "
        "ON CONFLICT (id) DO UPDATE SET v = excluded.v",
        "all",
    ),
    Context(
        "a BEFORE trigger on another table (writable CTE)",
        "WITH s AS (INSERT INTO side_before VALUES (1) RETURNING x) UPDATE mid SET v = 'tb' FROM s",
        "all",
    ),
    Context(
        "an AFTER trigger on another table (writable CTE)",
        "WITH s AS (INSERT INTO side_after VALUES (1) RETURNING x) UPDATE mid SET v = 'ta' FROM s",
        "none",
    ),
    Context("a function called per row", "UPDATE mid SET v = flipped('fn')", "all"),
]


def _reach(scope: str, ctx: Context) -> str:
    if scope == "key":
        return "all"  # checked after the statement: every switch comes first
    if scope == "table":
        return "none"  # checked once before the statement: no switch comes first
    return ctx.row_reach


def _look(db: Conn, scope: str) -> dict[str, Any]:
    fence_col = ", fencekit_fence" if scope == "row" else ""
    return {
        "rows": {
            r[0]: r[1:]
            for r in db.execute(f"SELECT id, k, v{fence_col} FROM mid ORDER BY id").fetchall()
        },
        "fences": fences(db, "public.mid"),
        "counts": counts(db, "mid"),
    }


def _judge(
    scope: str,
    on_missing: str,
    reach: str,
    value: str,
    before: dict[str, Any],
    after: dict[str, Any],
) -> str | None:
    """Why a successful statement must not have succeeded, or None when its success is sound."""
    ids = sorted(set(before["rows"]) | set(after["rows"]))
    changes = [
        (i, before["rows"].get(i), after["rows"].get(i))
        for i in ids
        if before["rows"].get(i) != after["rows"].get(i)
    ]
    not_fresh: list[str] = []  # written, but not under a fence the fresh token set
    lowered: list[str] = []
    if scope == "row":
        for rid, old, new in changes:
            if new is None:
                continue  # deleted: its fence went with it
            fence = new[-1]
            if fence != FRESH:
                not_fresh.append(f"row {rid} has fence {fence}")
            if old is not None and old[-1] is not None and (fence is None or fence < old[-1]):
                lowered.append(f"row {rid}: fence {old[-1]} -> {fence}")
    else:
        if scope == "table":
            keys = {""}
        else:
            keys = {str(r[0]) for _, old, new in changes for r in (old, new) if r is not None}
        for key in sorted(keys):
            fence, prior = after["fences"].get(key), before["fences"].get(key)
            if fence != FRESH:
                not_fresh.append(f"the fence of key {key!r} is {fence}")
            if prior is not None and (fence is None or fence < prior):
                lowered.append(f"key {key!r}: fence {prior} -> {fence}")
    if lowered:
        return "a fence went down: " + "; ".join(lowered)
    if reach == "none":
        if not_fresh:
            return "succeeded, but not judged by the fresh token: " + "; ".join(not_fresh)
        return None
    if value == "" and on_missing == "allow":
        unfenced = after["counts"].get("unfenced", 0) - before["counts"].get("unfenced", 0)
        if unfenced < 1:
            return "passed as an unfenced write that was NOT counted (the check was skipped)"
        return None
    what = "cleared token" if value == "" else f"token {value!r}"
    return (
        f"succeeded although a check after the switch saw the {what}: "
        + "; ".join(f"row {i}: {o} -> {n}" for i, o, n in changes)
        + f"; fences {after['fences']}"
    )


@pytest.mark.parametrize("on_missing", ["reject", "allow"])
@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_token_switched_mid_statement(
    db: Conn, make_role, findings: Findings, scope: str, on_missing: str
) -> None:
    db.execute(SCHEMA)
    table = TableName("public", "mid")
    spec = {
        "row": FenceSpec(table, on_missing=on_missing),
        "key": FenceSpec(table, scope=Scope.KEY, key=("k",), on_missing=on_missing),
        "table": FenceSpec(table, scope=Scope.TABLE, on_missing=on_missing),
    }[scope]
    protect(db, spec)
    db.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
    db.execute(SEED)
    db.commit()
    make_role(APP, DML)
    start = _look(db, scope)
    db.rollback()
    for role in (APP, None):
        who = "the app role (DML only)" if role else "the owner"
        for ctx in CONTEXTS:
            reach = _reach(scope, ctx)
            for value, wanted in SWITCHES.items():
                label = (
                    f"{scope} fence, on_missing={on_missing}, {ctx.name}, as {who}, "
                    f"token {FRESH} switched to {value!r}"
                )
                before = _look(db, scope)
                db.rollback()
                got = outcome(
                    db,
                    ctx.stmt.format(flip=_set(value)),
                    token=FRESH,
                    role=role,
                    settings={"sec.flip": f"to:{value}"},
                )
                if not got.ok:
                    # A row fence's check of a new row (the INSERT an upsert tries first) has no
                    # fence to find a valid token stale against: it refuses the token as other
                    # than the one the statement was checked under (YF004).
                    changed = scope == "row" and wanted == "YF001"
                    findings.expect(label, got, (wanted, "YF004") if changed else wanted)
                    continue
                if role is not None:
                    db.execute("RESET ROLE")
                after = _look(db, scope)
                db.rollback()
                problem = _judge(scope, on_missing, reach, value, before, after)
                findings.check(label, problem is None, problem or "")
    after = _look(db, scope)
    db.rollback()
    findings.check("the table after every attack", after["rows"] == start["rows"], "it changed")
    findings.assert_clean()
