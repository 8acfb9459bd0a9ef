"""The attack matrix, write side: every write path x scope x role with a stale token or none.

For each scope (row, key, table fence),
each write path (INSERT, upsert, UPDATE, DELETE, MERGE, COPY, TRUNCATE, a writable CTE, an
updatable view, an ON DELETE CASCADE from an unprotected parent, a partition written directly,
an inheritance child written through its protected parent and directly, and a protected table
written through an unprotected ancestor it was made a child of after protect) and each role
(app, owner, admin; see tests/security/_matrix.py), a write:

- under a stale token (5 < fence 10) is rejected with YF001 and counted as ``stale``;
- with no token is rejected with YF003 and counted as ``missing``;
- under a fresh token (50) advances the fence it passed: a write at 45 in the same transaction
  is then rejected (YF001).

Every cell runs in one transaction that is rolled back, in one database per module. A row
fence starts at a row's first write, so INSERT and COPY of a new row are not stale there; those
cells are left out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from fencekit.embedded import EmbeddedServer
from fencekit.spec import FenceSpec, Scope, TableName
from tests.security._matrix import MatrixDB, grant_tables, matrix_database
from tests.security._matrix import rejections as count_rejections
from tests.security.conftest import Outcome, outcome, protect

SCOPES = ("row", "key", "table")
FENCE, STALE, FRESH, BETWEEN = 10, 5, 50, 45
HIDDEN = 40  # the fence of the row an RLS policy hides


@dataclass(frozen=True)
class Path:
    """One write path: a statement per scope prefix ``{s}``, and COPY rows if it is COPY."""

    name: str
    stmt: str
    copy_rows: tuple[str, ...] = ()
    row_scope: bool = True  # False: a new row's first write, not stale under a row fence
    advances: bool = True  # the row survives it, so a row fence can be read afterwards
    since: int = 0  # PostgreSQL major the path needs


PATHS = [
    Path("insert", "INSERT INTO {s}_t (id, k, v) VALUES (100, 1, 0)", row_scope=False),
    Path(
        "upsert",
        "INSERT INTO {s}_t (id, k, v) VALUES (1, 1, 0) ON CONFLICT (id) DO UPDATE SET v = 7",
    ),
    Path("update", "UPDATE {s}_t SET v = v + 1 WHERE id = 1"),
    Path("delete", "DELETE FROM {s}_t WHERE id = 1", advances=False),
    Path(
        "merge",
        "MERGE INTO {s}_t t USING (VALUES (1)) s(id) ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET v = t.v + 1",
        since=15,
    ),
    Path("copy", "COPY {s}_t (id, k, v) FROM STDIN", copy_rows=("101\t1\t0",), row_scope=False),
    Path("truncate", "TRUNCATE {s}_t", advances=False),
    Path(
        "cte",
        "WITH w AS (UPDATE {s}_t SET v = v + 1 WHERE id = 1 RETURNING 1) SELECT count(*) FROM w",
    ),
    Path("view", "UPDATE {s}_v SET v = v + 1 WHERE id = 1"),
    Path("cascade", "DELETE FROM {s}_parent WHERE id = 1", advances=False),
    Path("partition", "UPDATE {s}_part_1 SET v = v + 1 WHERE id = 1"),
    Path("inheritance", "UPDATE {s}_inh SET v = v + 1 WHERE id = 1"),
    Path("inheritance-child", "UPDATE {s}_inh_c SET v = v + 1 WHERE id = 1"),
    Path("ancestor", "UPDATE {s}_anc SET v = v + 1 WHERE id = 1"),
]

# Cells that cannot exist: PostgreSQL refuses to make a table with transition-table row
# triggers an inheritance child or a partition, and every protected plain table has one
# (fencekit_<tag>_root), so no protected table gets an ancestor after protect (a table
# protected while already a child is reported by status: tests/cli/test_status_code.py).
IMPOSSIBLE = {("key", "ancestor"), ("row", "ancestor"), ("table", "ancestor")}


def _spec(scope: str, table: str) -> FenceSpec:
    name = TableName("public", table)
    if scope == "row":
        return FenceSpec(name)
    if scope == "key":
        return FenceSpec(name, scope=Scope.KEY, key=("k",))
    return FenceSpec(name, scope=Scope.TABLE)


def _build(m: MatrixDB) -> None:
    conn = m.conn
    conn.execute(f'SET ROLE "{m.role("owner")}"')
    for s in SCOPES:
        conn.execute(
            f"CREATE TABLE {s}_parent (id int PRIMARY KEY);"
            f"CREATE TABLE {s}_t (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL,"
            f"  pid int REFERENCES {s}_parent ON DELETE CASCADE);"
            f"CREATE VIEW {s}_v AS SELECT * FROM {s}_t;"
            f"CREATE TABLE {s}_part (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL)"
            "  PARTITION BY RANGE (id);"
            f"CREATE TABLE {s}_part_1 PARTITION OF {s}_part FOR VALUES FROM (0) TO (1000);"
            f"CREATE TABLE {s}_inh (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL);"
            f"CREATE TABLE {s}_inh_c () INHERITS ({s}_inh);"
            f"CREATE TABLE {s}_anc (id int, k int, v int);"
            f"CREATE TABLE {s}_sub (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL);"
            # on_missing=allow: a tokenless write is accepted and counted
            f"CREATE TABLE {s}_allow (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL)"
            "  PARTITION BY RANGE (id);"
            f"CREATE TABLE {s}_allow_1 PARTITION OF {s}_allow FOR VALUES FROM (0) TO (1000);"
            f"CREATE TABLE {s}_allow_2 PARTITION OF {s}_allow FOR VALUES FROM (1000) TO (2000);"
            # a policy that hides the row holding the highest fence from everyone but the
            # owner
            f"CREATE TABLE {s}_rls (id int PRIMARY KEY, k int NOT NULL, v int NOT NULL);"
            f"ALTER TABLE {s}_rls ENABLE ROW LEVEL SECURITY;"
            f"CREATE POLICY hide ON {s}_rls USING (id <> 2) WITH CHECK (true);"
        )
    conn.execute("RESET ROLE")
    for s in SCOPES:
        for table in (f"{s}_t", f"{s}_part", f"{s}_inh", f"{s}_sub", f"{s}_rls"):
            protect(conn, _spec(s, table))
        protect(conn, dataclasses.replace(_spec(s, f"{s}_allow"), on_missing="allow"))
    # Made a child of an unprotected parent after protect.
    conn.execute(f'SET ROLE "{m.role("owner")}"')
    for s in SCOPES:
        if (s, "ancestor") not in IMPOSSIBLE:
            conn.execute(f"ALTER TABLE {s}_sub INHERIT {s}_anc")
    conn.execute("RESET ROLE")
    grant_tables(m)
    conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(FENCE),))
    for s in SCOPES:
        conn.execute(
            f"INSERT INTO {s}_parent VALUES (1);"
            f"INSERT INTO {s}_t VALUES (1, 1, 0, 1);"
            f"INSERT INTO {s}_part VALUES (1, 1, 0);"
            f"INSERT INTO {s}_inh_c VALUES (1, 1, 0);"
            f"INSERT INTO {s}_sub VALUES (1, 1, 0);"
            f"INSERT INTO {s}_allow VALUES (1, 1, 0);"
            f"INSERT INTO {s}_rls VALUES (1, 1, 0);"
        )
    conn.commit()
    conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(HIDDEN),))
    for s in SCOPES:
        conn.execute(f"INSERT INTO {s}_rls VALUES (2, 1, 0)")
    conn.commit()


@pytest.fixture(scope="module")
def mx(pg_server: EmbeddedServer) -> Iterator[MatrixDB]:
    with matrix_database(pg_server, "mxw") as m:
        _build(m)
        yield m


def _cells(*, advancing: bool = False) -> list[Any]:
    cells = []
    for s in SCOPES:
        for p in PATHS:
            if (s == "row" and not p.row_scope) or (s, p.name) in IMPOSSIBLE:
                continue
            if advancing and s == "row" and not p.advances:
                continue
            for role in ("app", "owner", "admin"):
                cells.append(pytest.param(s, p, role, id=f"{s}-{p.name}-{role}"))
    return cells


def _run(m: MatrixDB, s: str, p: Path, role: str, token: int | None) -> Outcome:
    return outcome(
        m.conn,
        p.stmt.format(s=s),
        token=token,
        role=m.role(role),
        copy_rows=p.copy_rows,
    )


def _skip_old(m: MatrixDB, p: Path) -> None:
    if p.since and m.conn.info.server_version < p.since * 10000:
        pytest.skip(f"{p.name} needs PostgreSQL {p.since}+")


@pytest.mark.parametrize(("scope", "path", "role"), _cells())
@pytest.mark.parametrize(
    ("token", "sqlstate", "reason"),
    [(STALE, "YF001", "stale"), (None, "YF003", "missing")],
    ids=["stale", "missing"],
)
def test_stale_or_missing_token_is_rejected_and_counted(
    mx: MatrixDB, scope: str, path: Path, role: str, token: int | None, sqlstate: str, reason: str
) -> None:
    _skip_old(mx, path)
    before = count_rejections(mx.conn)
    got = _run(mx, scope, path, role, token)
    mx.conn.rollback()
    after = count_rejections(mx.conn)
    assert got.sqlstate == sqlstate, f"{scope} {path.name} as {role}: {got}"
    assert after.get(reason, 0) > before.get(reason, 0), f"not counted as {reason}"


@pytest.mark.parametrize(("scope", "path", "role"), _cells(advancing=True))
def test_a_fresh_token_advances_the_fence_it_passed(
    mx: MatrixDB, scope: str, path: Path, role: str
) -> None:
    """After a write at 50 through the path, a write at 45 (same transaction) is stale."""
    _skip_old(mx, path)
    first = _run(mx, scope, path, role, FRESH)
    assert first.ok, f"{scope} {path.name} as {role} at {FRESH}: {first}"
    try:
        # The same table the path wrote (for a cascade or view: the protected table behind it).
        target = {
            "partition": f"{scope}_part",
            "inheritance": f"{scope}_inh",
            "inheritance-child": f"{scope}_inh",
            "ancestor": f"{scope}_sub",
        }.get(path.name, f"{scope}_t")
        mx.conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(BETWEEN),))
        stmt = (
            f"UPDATE {target} SET v = v + 1 WHERE id = 1"
            if scope == "row"
            else f"INSERT INTO {target} (id, k, v) VALUES (500, 1, 0)"
        )
        second = Outcome(None)
        try:
            mx.conn.execute(stmt)
        except psycopg.Error as exc:
            second = Outcome(exc.sqlstate or "?????", str(exc))
    finally:
        mx.conn.rollback()
    assert second.sqlstate == "YF001", (
        f"{scope} {path.name} as {role}: after {FRESH}, a write at {BETWEEN} gave {second}"
    )


# Counting the unfenced writes of on_missing=allow: a plain tokenless write, and one whose
# statement first sets fencekit.counted to the value fencekit expects for it.
_FORGE = (
    "SELECT set_config('fencekit.counted', concat_ws(' ', 'unfenced', "
    "(SELECT tag FROM fencekit.protected WHERE table_name = '{table}'), "
    "date_part('epoch', statement_timestamp())), true); "
)


@pytest.mark.parametrize(
    ("scope", "role", "forged"),
    [
        pytest.param(s, r, f, id=f"{s}-{r}-{'forged' if f else 'plain'}")
        for s in SCOPES
        for r in ("app", "owner", "admin")
        for f in (False, True)
    ],
)
def test_every_unfenced_write_is_counted(mx: MatrixDB, scope: str, role: str, forged: bool) -> None:
    table = f"{scope}_allow"
    stmt = f"UPDATE {table} SET v = v + 1 WHERE id = 1"
    if forged:
        stmt = _FORGE.format(table=table) + stmt
    before = count_rejections(mx.conn)
    got = outcome(mx.conn, stmt, role=mx.role(role))
    mx.conn.rollback()
    after = count_rejections(mx.conn)
    assert got.ok, f"{scope} tokenless write as {role} under on_missing=allow: {got}"
    assert after.get("unfenced", 0) > before.get("unfenced", 0), "the unfenced write went uncounted"


@pytest.mark.parametrize(
    ("scope", "role"),
    [pytest.param(s, r, id=f"{s}-{r}") for s in SCOPES for r in ("app", "owner", "admin")],
)
def test_a_tokenless_partition_move_keeps_the_fence(mx: MatrixDB, scope: str, role: str) -> None:
    """Under on_missing=allow, a tokenless UPDATE that moves the row to another partition
    lowers nothing: a stale write to the moved row is still rejected."""
    table = f"{scope}_allow"
    got = outcome(mx.conn, f"UPDATE {table} SET id = 1500 WHERE id = 1", role=mx.role(role))
    try:
        assert got.ok, f"the tokenless move as {role}: {got}"
        mx.conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(STALE),))
        mx.conn.execute("SAVEPOINT stale")
        try:
            mx.conn.execute(f"UPDATE {table} SET v = v + 1 WHERE id = 1500")
            second = Outcome(None)
        except psycopg.Error as exc:
            second = Outcome(exc.sqlstate or "?????", str(exc))
    finally:
        mx.conn.rollback()
    assert second.sqlstate == "YF001", f"{scope}: after a tokenless move, T({STALE}) gave {second}"


@pytest.mark.parametrize(
    ("scope", "role"),
    [pytest.param(s, r, id=f"{s}-{r}") for s in SCOPES for r in ("app", "owner", "admin")],
)
def test_truncate_sees_rows_a_policy_hides(mx: MatrixDB, scope: str, role: str) -> None:
    """A row the writer's RLS policy hides still holds its fence: T(20) TRUNCATE is stale
    against its 40."""
    before = count_rejections(mx.conn)
    got = outcome(
        mx.conn,
        sql.SQL("TRUNCATE {}").format(sql.Identifier(f"{scope}_rls")).as_string(mx.conn),
        token=20,
        role=mx.role(role),
    )
    mx.conn.rollback()
    after = count_rejections(mx.conn)
    assert got.sqlstate == "YF001", (
        f"{scope} T(20) TRUNCATE as {role} past a hidden fence 40: {got}"
    )
    assert after.get("stale", 0) > before.get("stale", 0)


# Paths that keep row 1 (so every statement touches a row) and write through the key fence's
# key 1 or the table fence; INSERT gets a fresh id each time.
_SEQUENCE_PATHS = {
    "insert": "INSERT INTO {s}_t (id, k, v) VALUES ({n}, 1, 0)",
    "upsert": "INSERT INTO {s}_t (id, k, v) VALUES (1, 1, 0) ON CONFLICT (id) DO UPDATE SET v = 7",
    "update": "UPDATE {s}_t SET v = v + 1 WHERE id = 1",
    "cte": "WITH w AS (UPDATE {s}_t SET v = v + 1 WHERE id = 1 RETURNING 1) SELECT count(*) FROM w",
    "view": "UPDATE {s}_v SET v = v + 1 WHERE id = 1",
    "partition": "UPDATE {s}_part_1 SET v = v + 1 WHERE id = 1",
}


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    scope=st.sampled_from(["key", "table"]),
    writes=st.lists(
        st.tuples(
            st.sampled_from(sorted(_SEQUENCE_PATHS)),
            st.sampled_from(["app", "owner", "admin"]),
            st.integers(min_value=1, max_value=60),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_random_write_sequences_keep_the_fence_contract(
    mx: MatrixDB, scope: str, writes: list[tuple[str, str, int]]
) -> None:
    """Any sequence of writes, through any of these paths, by any role, under any token: each
    is accepted exactly when its token is not below the highest token accepted so far (and the
    fence starts at 10). One transaction, a savepoint per write, rolled back at the end."""
    conn = mx.conn
    conn.rollback()
    fence = FENCE
    seen: list[str] = []
    try:
        for n, (path, role, token) in enumerate(writes, start=1000):
            target = _SEQUENCE_PATHS[path].format(s=scope, n=n)
            conn.execute("SAVEPOINT w")
            conn.execute(f'SET LOCAL ROLE "{mx.role(role)}"')
            conn.execute("SELECT set_config('fencekit.token', %s, true)", (str(token),))
            try:
                conn.execute(target)
                got = "ok"
            except psycopg.Error as exc:
                got = exc.sqlstate or "?????"
                conn.execute("ROLLBACK TO SAVEPOINT w")
            conn.execute("RESET ROLE")
            # The partition belongs to another table: its fence is its own resource's.
            own = path == "partition"
            wanted = "ok" if own or token >= fence else "YF001"
            seen.append(f"{path} as {role} at {token}: {got} (fence {fence})")
            if path != "partition":
                assert got == wanted, "\n".join(seen)
                if got == "ok":
                    fence = max(fence, token)
            elif got not in ("ok", "YF001"):
                raise AssertionError("\n".join(seen))
    finally:
        conn.rollback()
