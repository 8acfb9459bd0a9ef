"""Every path a token passes advances the fence it passed; no tokenless write lowers a fence; a
check sees every row; a protected table cannot be written around its checks.

Each attack runs as the application role (DML, TRUNCATE and fencekit_writer) and as the table's
owner (not an admin), through ``SET LOCAL ROLE`` on a superuser connection that protected the
tables (the role that ran protect owns fencekit's definer functions, as in production).
"""

from __future__ import annotations

import pytest

from fencekit.spec import FenceSpec, Scope, TableName
from tests.security.conftest import Conn, Findings, fences, outcome, protect

STALE, MISSING = "YF001", "YF003"
ROLES = ("wp_app", "wp_owner")


@pytest.fixture
def roles(db: Conn, make_role: object) -> Conn:
    make_role("wp_owner", "fencekit_writer")  # type: ignore[operator]
    make_role(  # type: ignore[operator]
        "wp_app",
        "SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public",
        "fencekit_writer",
    )
    return db


def _setup(db: Conn, ddl: str, specs: list[FenceSpec], seed: str, token: int = 40) -> None:
    db.execute(ddl)
    for spec in specs:
        # The owner first: a row fence's TRUNCATE check is given to the table's owner.
        db.execute(f"ALTER TABLE {spec.table.sql} OWNER TO wp_owner")
        protect(db, spec)
    db.execute(
        "GRANT SELECT, INSERT, UPDATE, DELETE, TRUNCATE ON ALL TABLES IN SCHEMA public TO wp_app"
    )
    db.commit()
    db.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
    db.execute(seed)
    db.commit()


def _done(db: Conn) -> None:
    db.commit()


# ------------------------------------------------------------------- TRUNCATE advances


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("scope", ["key", "table"])
def test_truncate_advances_key_and_table_fences(
    roles: Conn, findings: Findings, role: str, scope: str
) -> None:
    """Fence at 40, ``T(50): TRUNCATE`` accepted: a later ``T(45)`` write is stale everywhere
    in the resource (a key seen before, a key never seen), and the fences hold 50."""
    db = roles
    spec = (
        FenceSpec(TableName("public", "kt"), scope=Scope.KEY, key=("account_id",))
        if scope == "key"
        else FenceSpec(TableName("public", "kt"), scope=Scope.TABLE)
    )
    _setup(
        db,
        "CREATE TABLE kt (id int PRIMARY KEY, account_id int NOT NULL, v int)",
        [spec],
        "INSERT INTO kt VALUES (1, 1, 0), (2, 2, 0)",
    )
    label = f"{scope}/{role}"
    if findings.expect(
        f"{label}: T(50) TRUNCATE", outcome(db, "TRUNCATE kt", token=50, role=role), None
    ):
        _done(db)
    held = fences(db, spec.resource_name)
    db.rollback()
    findings.check(
        f"{label}: fences after TRUNCATE", all(f >= 50 for f in held.values()), str(held)
    )
    for what, stmt in [
        ("a key seen before", "INSERT INTO kt VALUES (10, 1, 0)"),
        ("a key never seen", "INSERT INTO kt VALUES (11, 3, 0)"),
    ]:
        findings.expect(
            f"{label}: T(45) INSERT, {what}", outcome(db, stmt, token=45, role=role), STALE
        )
    findings.expect(
        f"{label}: T(50) INSERT after the TRUNCATE",
        outcome(db, "INSERT INTO kt VALUES (12, 1, 0)", token=50, role=role),
        None,
    )
    db.rollback()
    findings.expect(
        f"{label}: T(39) TRUNCATE", outcome(db, "TRUNCATE kt", token=39, role=role), STALE
    )
    findings.assert_clean()


# ------------------------------------------------------- checks see through RLS policies


@pytest.mark.parametrize("force", [False, True], ids=["enabled", "forced"])
@pytest.mark.parametrize("role", ROLES)
def test_row_truncate_check_sees_rows_hidden_by_rls(
    roles: Conn, findings: Findings, role: str, force: bool
) -> None:
    """A policy hides the row fenced at 40 from the writer: ``T(10): TRUNCATE`` is still stale
    (the check reads every row as the table's owner, whom an unforced policy does not apply
    to). A policy forced on the owner too (FORCE ROW LEVEL SECURITY) could hide rows from the
    check itself: every TRUNCATE under a token is refused (YF000), never judged on a part."""
    db = roles
    _setup(
        db,
        "CREATE TABLE rt (id int PRIMARY KEY, v int)",
        [FenceSpec(TableName("public", "rt"))],
        "INSERT INTO rt VALUES (1, 0)",
        token=10,
    )
    db.execute("SELECT set_config('fencekit.token', '40', true)")
    db.execute("INSERT INTO rt VALUES (2, 0)")
    db.execute("ALTER TABLE rt ENABLE ROW LEVEL SECURITY; CREATE POLICY hide ON rt USING (id <> 2)")
    if force:
        db.execute("ALTER TABLE rt FORCE ROW LEVEL SECURITY")
    db.commit()
    if role == "wp_app" or force:
        got = outcome(db, "SELECT count(*) FROM rt", role=role)
        findings.check(f"{role}: the policy hides a row", got.ok)
        if got.ok:
            seen = db.execute("SELECT count(*) FROM rt").fetchone()
            findings.check(f"{role}: the policy hides a row", seen == (1,), str(seen))
            db.rollback()
    findings.expect(
        f"{role}: T(10) TRUNCATE",
        outcome(db, "TRUNCATE rt", token=10, role=role),
        "YF000" if force else STALE,
    )
    findings.expect(
        f"{role}: T(40) TRUNCATE",
        outcome(db, "TRUNCATE rt", token=40, role=role),
        "YF000" if force else None,
    )
    db.rollback()
    findings.assert_clean()


# ------------------------------------------------- no tokenless write lowers a row fence


def _tokenless_paths(server_version: int) -> list[tuple[str, str]]:
    paths = [
        ("UPDATE moving the row to another partition", "UPDATE pm SET part = 2 WHERE id = 1"),
        ("UPDATE SET fence = NULL", "UPDATE pm SET fencekit_fence = NULL WHERE id = 1"),
        ("UPDATE SET fence = 1", "UPDATE pm SET fencekit_fence = 1 WHERE id = 1"),
        ("UPDATE SET fence = DEFAULT", "UPDATE pm SET fencekit_fence = DEFAULT WHERE id = 1"),
        (
            "upsert DO UPDATE SET fence = NULL",
            "INSERT INTO pm (id, part, v) VALUES (1, 1, 9) ON CONFLICT (id, part) "
            "DO UPDATE SET v = 9, fencekit_fence = NULL",
        ),
        (
            "UPDATE moving the row back and forth",
            "UPDATE pm SET part = 3 - part, fencekit_fence = NULL WHERE id = 1",
        ),
    ]
    if server_version >= 150000:
        paths.append(
            (
                "MERGE UPDATE moving the row",
                "MERGE INTO pm USING (VALUES (1)) AS s(id) ON pm.id = s.id "
                "WHEN MATCHED THEN UPDATE SET part = 3 - pm.part, fencekit_fence = NULL",
            )
        )
    return paths


@pytest.mark.parametrize("role", ROLES)
def test_tokenless_writes_never_lower_a_row_fence(
    roles: Conn, findings: Findings, role: str
) -> None:
    """on_missing=allow: each tokenless write is accepted, and the row keeps fence 40, so a
    stale ``T(3)`` is still rejected."""
    db = roles
    _setup(
        db,
        "CREATE TABLE pm (id int, part int, v int, PRIMARY KEY (id, part))"
        " PARTITION BY LIST (part);"
        "CREATE TABLE pm_1 PARTITION OF pm FOR VALUES IN (1);"
        "CREATE TABLE pm_2 PARTITION OF pm FOR VALUES IN (2);",
        [FenceSpec(TableName("public", "pm"), on_missing="allow")],
        "INSERT INTO pm (id, part, v) VALUES (1, 1, 0)",
    )
    version = db.info.server_version
    for what, stmt in _tokenless_paths(version):
        if findings.expect(f"{role}: tokenless {what}", outcome(db, stmt, role=role), None):
            _done(db)
        row = db.execute("SELECT array_agg(fencekit_fence) FROM pm WHERE id = 1").fetchone()
        db.rollback()
        findings.check(
            f"{role}: fence after tokenless {what}",
            row is not None and row[0] is not None and all(f == 40 for f in row[0]),
            str(row),
        )
        findings.expect(
            f"{role}: T(3) after tokenless {what}",
            outcome(db, "UPDATE pm SET v = 3 WHERE id = 1", token=3, role=role),
            STALE,
        )
        # Put the row back where it started for the next path.
        db.execute("SELECT set_config('fencekit.token', '40', true)")
        db.execute("DELETE FROM pm; INSERT INTO pm (id, part, v) VALUES (1, 1, 0)")
        db.commit()
    findings.assert_clean()


# -------------------------------------------- no writes around the checks via a parent


@pytest.mark.parametrize("scope", ["row", "key", "table"])
def test_protected_table_cannot_become_a_child_of_an_unprotected_table(
    roles: Conn, findings: Findings, scope: str
) -> None:
    """The owner makes the protected table a child (INHERIT) or a partition (ATTACH PARTITION)
    of a table fencekit does not protect; then the app writes through that parent with no
    token. Either the DDL is refused, or the write is."""
    db = roles
    spec = FenceSpec(
        TableName("public", "te"),
        scope=Scope(scope),
        key=("k",) if scope == "key" else (),
    )
    _setup(
        db,
        "CREATE TABLE te (id int NOT NULL, k int NOT NULL, v int);"
        "CREATE TABLE shadow (id int NOT NULL, k int NOT NULL, v int);"
        "CREATE TABLE shadow_p (id int NOT NULL, k int NOT NULL, v int) PARTITION BY LIST (k);"
        "ALTER TABLE shadow OWNER TO wp_owner; ALTER TABLE shadow_p OWNER TO wp_owner;",
        [spec],
        "INSERT INTO te VALUES (1, 1, 0)",
    )
    if scope == "row":
        db.execute(
            "ALTER TABLE shadow ADD COLUMN fencekit_fence bigint;"
            "ALTER TABLE shadow_p ADD COLUMN fencekit_fence bigint"
        )
        db.commit()
    for how, ddl, parent in [
        ("INHERIT", "ALTER TABLE te INHERIT shadow", "shadow"),
        (
            "ATTACH PARTITION",
            "ALTER TABLE shadow_p ATTACH PARTITION te FOR VALUES IN (1)",
            "shadow_p",
        ),
    ]:
        label = f"{scope}: {how}"
        made = outcome(db, ddl, role="wp_owner")
        if not made.ok:
            continue  # refused: nothing can be written around the checks
        _done(db)
        for stmt in [f"UPDATE {parent} SET v = v + 1", f"DELETE FROM {parent}"]:
            findings.expect(
                f"{label}, then {stmt} with no token", outcome(db, stmt, role="wp_app"), MISSING
            )
            db.rollback()
        findings.expect(
            f"{label}, then INSERT through the parent with no token",
            outcome(db, f"INSERT INTO {parent} (id, k, v) VALUES (5, 1, 0)", role="wp_app"),
            MISSING,
        )
        db.rollback()
    findings.assert_clean()


# ------------------------------------------- the shared judgement is not the writers' to call


def test_writers_cannot_call_the_shared_judgement(roles: Conn) -> None:
    """``fencekit.judge_fences`` writes fences as its definer: only the generated trigger
    functions (owned by fencekit_admin members) call it; a writer or owner gets 42501."""
    db = roles
    for role in ROLES:
        got = outcome(
            db,
            "SELECT fencekit.judge_fences('t', 0, 'x', 'r', ARRAY['1'], 9000000000, 'accept', "
            "false)",
            role=role,
        )
        assert got.sqlstate == "42501", f"{role}: {got}"
    assert fences(db, "r") == {}
