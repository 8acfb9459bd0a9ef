"""Every unfenced and every bypassed write is counted; no session setting decides whether.

Before this change fencekit counted an allowed tokenless write (``unfenced``) or a bypassed one
once per statement by remembering, in the session setting ``fencekit.counted``, the value
``'<unfenced|bypassed> <tag> <statement epoch>'``. A writer that set that value itself, in the
same top-level statement as its write (a DO block, or two statements in one simple query),
wrote without being counted; an admin did the same with ``'bypassed'``; and every write after
the first inside one DO block went uncounted. Now each check that lets a write through counts
it in a sequence: once per statement, on every scope (a row fence's row checks count only the
rows of a statement whose token was cleared after its statement check saw it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.core.helpers import make_app_role, one, protect, rejection_count, write

Conn = psycopg.Connection[Any]

SCOPES = {
    "r_row": {"scope": "row"},
    "r_key": {"scope": "key", "key": ("k",)},
    "r_table": {"scope": "table"},
}


@pytest.fixture
def tables(db: Conn) -> dict[str, str]:
    """One on_missing=allow table per scope, each with rows 1 and 2, fence 10; their tags."""
    tags = {}
    for name, kw in SCOPES.items():
        db.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, k int NOT NULL, v int)")
        db.commit()
        protect(db, name, on_missing="allow", **kw)  # type: ignore[arg-type]
        write(db, 10, f"INSERT INTO {name} VALUES (1, 1, 0), (2, 2, 0)")
        tags[name] = one(db, "SELECT tag FROM fencekit.protected WHERE table_name = %s", [name])
    return tags


def _forged(what: str, tag: str) -> str:
    """The value the old code wrote after counting, computed in the writer's own statement."""
    return (
        f"PERFORM set_config('fencekit.counted', concat_ws(' ', '{what}', '{tag}', "
        "date_part('epoch', statement_timestamp())), true);"
    )


@pytest.mark.parametrize("table", list(SCOPES))
def test_a_writer_cannot_forge_the_counted_marker(
    db: Conn, tables: dict[str, str], make_role: Callable[..., str], table: str
) -> None:
    app = make_app_role(make_role, "dodge_app")
    with psycopg.connect(app, autocommit=True) as conn:
        conn.execute(
            f"DO $$ BEGIN {_forged('unfenced', tables[table])} "
            f"UPDATE {table} SET v = v + 1 WHERE id = 1; END $$"
        )
        # The same with two statements in one simple query (one statement_timestamp).
        conn.execute(
            f"SELECT set_config('fencekit.counted', concat_ws(' ', 'unfenced', "
            f"'{tables[table]}', date_part('epoch', statement_timestamp())), false); "
            f"UPDATE {table} SET v = v + 1 WHERE id = 1"
        )
    assert rejection_count(db, table, "unfenced") == 2
    assert one(db, f"SELECT v FROM {table} WHERE id = 1") == 2


@pytest.mark.parametrize("table", list(SCOPES))
def test_every_statement_of_a_do_block_is_counted(
    db: Conn, tables: dict[str, str], make_role: Callable[..., str], table: str
) -> None:
    app = make_app_role(make_role, "dodge_loop")
    with psycopg.connect(app, autocommit=True) as conn:
        conn.execute(
            f"DO $$ BEGIN FOR i IN 1..5 LOOP UPDATE {table} SET v = v + 1 WHERE id = 1; "
            "END LOOP; END $$"
        )
    assert rejection_count(db, table, "unfenced") == 5


@pytest.mark.parametrize("table", list(SCOPES))
def test_an_admin_cannot_forge_the_bypassed_marker(
    db: Conn, tables: dict[str, str], make_role: Callable[..., str], table: str
) -> None:
    admin = make_app_role(make_role, "dodge_admin", admin=True)
    with psycopg.connect(admin, autocommit=True) as conn:
        # Without a token (bypass instead of on_missing=allow) and with a stale token.
        for token in ("", "5"):
            conn.execute(
                "DO $$ BEGIN PERFORM set_config('fencekit.bypass', 'on', true); "
                f"PERFORM set_config('fencekit.token', '{token}', true); "
                f"{_forged('bypassed', tables[table])} "
                f"UPDATE {table} SET v = v + 1 WHERE id = 1; END $$"
            )
    assert rejection_count(db, table, "bypassed") == 2
    assert rejection_count(db, table, "unfenced") == 0
    assert one(db, f"SELECT v FROM {table} WHERE id = 1") == 2


def test_row_fences_count_a_token_cleared_mid_statement_row_by_row(
    db: Conn, tables: dict[str, str], make_role: Callable[..., str]
) -> None:
    """A row fence counts a tokenless statement once, in its statement check, whatever rows it
    writes (none included); a statement whose token is cleared after that check saw it counts
    each row written without it, in the row checks."""
    db.execute(
        "CREATE FUNCTION public.clear_token() RETURNS int LANGUAGE sql VOLATILE "
        "AS $$ SELECT length(set_config('fencekit.token', '', true)) $$"
    )
    db.execute("GRANT EXECUTE ON FUNCTION public.clear_token() TO PUBLIC")
    db.commit()
    app = make_app_role(make_role, "dodge_rows")
    with psycopg.connect(app, autocommit=True) as conn:
        conn.execute("UPDATE r_row SET v = v + 1")  # two rows, one statement
        assert rejection_count(db, "r_row", "unfenced") == 1
        with conn.transaction():
            conn.execute("SELECT set_config('fencekit.token', '11', true)")
            conn.execute("UPDATE r_row SET v = v + 1 + public.clear_token()")
        assert rejection_count(db, "r_row", "unfenced") == 3
        conn.execute("UPDATE r_row SET v = v + 1 WHERE id > 100")  # no row, still a statement
        assert rejection_count(db, "r_row", "unfenced") == 4
    # Neither write moved the fences.
    assert one(db, "SELECT array_agg(fencekit_fence ORDER BY id) FROM r_row") == [10, 10]


def test_truncate_without_a_token_is_counted_once(
    db: Conn, tables: dict[str, str], make_role: Callable[..., str]
) -> None:
    db.execute("GRANT TRUNCATE ON r_row, r_key, r_table TO PUBLIC")
    db.commit()
    app = make_app_role(make_role, "dodge_trunc")
    with psycopg.connect(app, autocommit=True) as conn:
        for table in SCOPES:
            conn.execute(f"TRUNCATE {table}")
    for table in SCOPES:
        assert rejection_count(db, table, "unfenced") == 1, table


def test_writers_may_add_to_the_write_counters_but_never_lower_them(
    db: Conn, tables: dict[str, str], make_role: Callable[..., str]
) -> None:
    """What the grant that replaced count_event's SECURITY DEFINER lends: nextval() on the
    unfenced and bypassed counters, nothing else."""
    tag = tables["r_key"]
    app = make_app_role(make_role, "dodge_seq")
    with psycopg.connect(app, autocommit=True) as conn:
        conn.execute("UPDATE r_key SET v = v + 1")
        for counter in ("unfenced", "bypassed", "stale", "last_at:stale", "last_at:missing"):
            seq = f'fencekit."{tag}:{counter}"'
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT setval('{seq}', 1)")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"ALTER SEQUENCE {seq} RESTART")
        for reason in ("stale", "missing", "bypass_refused"):  # rejections: fencekit.reject only
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT nextval('fencekit.\"{tag}:{reason}\"')")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT fencekit.count_event(%s, 0, %s)", [tag, reason])
        assert conn.execute(
            "SELECT count FROM fencekit.rejections WHERE table_name = 'r_key' "
            "AND reason = 'unfenced'"
        ).fetchone() == (1,)
